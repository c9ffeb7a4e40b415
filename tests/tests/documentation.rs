#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The documentation tools and catalog resources, through the binary.

use serde_json::{Value, json};
use snowluma_e2e::*;

fn session() -> Mcp {
    let mut s = Mcp::spawn(&[]);
    s.initialize("2025-11-25");
    s
}

fn result(r: &Value) -> &Value {
    assert!(!is_error(r), "tool error: {r}");
    &structured(r)["result"]
}

fn names(v: &Value) -> Vec<String> {
    v["actions"].as_array().unwrap().iter().map(|a| a["name"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn list_actions_filters_and_pagination() {
    let mut s = session();
    let all = s.call("list_actions", json!({}));
    let r = result(&all).clone();
    assert_eq!(r["count"], 193);
    assert!(r.get("total").is_none(), "no pagination fields without limit/offset");
    let compact = &r["actions"][0];
    assert!(compact.get("inputSchema").is_none() && compact.get("examples").is_none(), "list results stay compact");
    // The text block carries the same result JSON.
    let text_json: Value = serde_json::from_str(&text(&all)).unwrap();
    assert_eq!(text_json, r);
    assert_eq!(structured(&all)["diagnostics"]["outcome"], "success");

    let r = s.call("list_actions", json!({"category": "群管理"}));
    assert_eq!(result(&r)["count"], 18);
    let r = s.call("list_actions", json!({"stream": true}));
    assert_eq!(result(&r)["count"], 5);
    let r = s.call("list_actions", json!({"read_only": true}));
    assert_eq!(result(&r)["count"], 79);

    let p1 = s.call("list_actions", json!({"limit": 100}));
    let p1 = result(&p1).clone();
    assert_eq!(
        (p1["count"].clone(), p1["total"].clone(), p1["next_offset"].clone()),
        (json!(100), json!(193), json!(100))
    );
    let p2 = s.call("list_actions", json!({"limit": 100, "offset": 100}));
    let p2 = result(&p2).clone();
    assert_eq!((p2["count"].clone(), p2["next_offset"].clone()), (json!(93), Value::Null));
    let mut joined = names(&p1);
    joined.extend(names(&p2));
    assert_eq!(joined, names(result(&all)));
    let r = s.call("list_actions", json!({"offset": 500}));
    assert_eq!(result(&r)["count"], 0);

    for bad in [json!({"limit": 0}), json!({"limit": 201}), json!({"offset": -1}), json!({"read_only": "yes"})] {
        let r = s.call("list_actions", bad.clone());
        assert!(is_error(&r), "{bad} should be refused");
        assert!(structured(&r)["result"].is_null());
    }
    // As Node: an unknown category lists nothing, an empty one is no filter.
    let r = s.call("list_actions", json!({"category": "nope"}));
    assert_eq!(result(&r)["count"], 0);
    let r = s.call("list_actions", json!({"category": ""}));
    assert_eq!(result(&r)["count"], 193);
}

#[test]
fn search_substring_and_keywords() {
    let mut s = session();
    let r = s.call("search_actions", json!({"query": "GET_STATUS"}));
    assert_eq!(names(result(&r)), ["get_status"]);
    let r = s.call("search_actions", json!({"query": "rkey"}));
    assert!(names(result(&r)).contains(&"get_rkey".to_owned()));
    let r = s.call("search_actions", json!({"query": ""}));
    assert_eq!(result(&r)["count"], 193);

    let r = s.call("search_actions", json!({"query": "群 禁言", "match": "keywords"}));
    let hits = names(result(&r));
    assert!(hits.contains(&"set_group_ban".to_owned()), "{hits:?}");
    assert!(hits.contains(&"set_group_whole_ban".to_owned()), "{hits:?}");
    assert!(!hits.contains(&"get_status".to_owned()));
    // An exact name ranks first even where catalog order would not put it there.
    let r = s.call("search_actions", json!({"query": "send_msg", "match": "keywords"}));
    assert_eq!(names(result(&r))[0], "send_msg");
    let r = s.call("search_actions", json!({"query": "nc_get_rkey", "match": "keywords"}));
    assert_eq!(names(result(&r))[0], "get_rkey");
    // Filters and pagination combine with search.
    let r = s.call(
        "search_actions",
        json!({"query": "group", "match": "keywords", "read_only": false, "stream": false, "limit": 3, "offset": 0}),
    );
    let page = result(&r).clone();
    assert_eq!(page["count"], 3);
    assert!(page["total"].as_u64().unwrap() > 3);
    let r = s.call("search_actions", json!({"query": "x", "match": "fuzzy"}));
    assert!(is_error(&r));
    // As Node: a missing query matches everything.
    let r = s.call("search_actions", json!({}));
    assert_eq!(result(&r)["count"], 193);
}

#[test]
fn get_action_gives_the_whole_contract_for_names_and_aliases() {
    let mut s = session();
    let r = s.call("get_action", json!({"name": "nc_get_rkey"}));
    let a = result(&r).clone();
    assert_eq!(a["name"], "get_rkey");
    assert!(a["aliases"].as_array().unwrap().contains(&json!("nc_get_rkey")));
    for k in ["inputSchema", "returnsSchema", "examples", "params", "summary_en", "description_en"] {
        assert!(a.get(k).is_some(), "{k} missing");
    }
    let r = s.call("get_action", json!({"name": "get_msg"}));
    let a = result(&r).clone();
    let ex = &a["examples"][0]["params"]["message_id"];
    assert!(ex.as_i64().unwrap() < 0, "signed message ids stay negative: {ex}");
    let r = s.call("get_action", json!({"name": "get_record_text"}));
    assert_eq!(result(&r)["name"], "fetch_ptt_text");
    let r = s.call("get_action", json!({"name": "no_such_action"}));
    assert!(is_error(&r));
    assert_eq!(structured(&r)["diagnostics"]["kind"], "unknown_action");
    assert!(structured(&r)["diagnostics"]["next_step"].as_str().unwrap().contains("search_actions"));
}

#[test]
fn list_categories_counts() {
    let mut s = session();
    let r = s.call("list_categories", json!({}));
    let cats = result(&r).as_array().unwrap().clone();
    assert_eq!(cats.len(), 12);
    assert_eq!(cats[0], json!({"category": "信息", "count": 5}));
    let total: u64 = cats.iter().map(|c| c["count"].as_u64().unwrap()).sum();
    assert_eq!(total, 193);
}

#[test]
fn resources_and_templates_in_both_eras() {
    let mut s = session();
    let list = s.ok("resources/list", Value::Null);
    assert_eq!(list["resources"][0]["uri"], "snowluma://onebot/actions");
    assert!(list.get("ttlMs").is_none());
    let read = s.ok("resources/read", json!({"uri": "snowluma://onebot/actions"}));
    let doc: Value = serde_json::from_str(read["contents"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(doc["actions"].as_array().unwrap().len(), 193);
    assert!(doc["version"].as_str().unwrap().len() > 4);
    for a in doc["actions"].as_array().unwrap() {
        assert!(a["returnsSchema"].is_object() && !a["examples"].as_array().unwrap().is_empty(), "{}", a["name"]);
    }
    let one = s.ok("resources/read", json!({"uri": "snowluma://onebot/actions/.ocr_image"}));
    let a: Value = serde_json::from_str(one["contents"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(a["name"], "ocr_image");
    let missing = s.request("resources/read", json!({"uri": "snowluma://onebot/nothing"}));
    assert_eq!(missing["error"]["code"], -32002, "legacy resource-not-found: {missing}");
    let t = s.ok("resources/templates/list", Value::Null);
    assert_eq!(t["resourceTemplates"][0]["uriTemplate"], "snowluma://onebot/actions/{name}");

    // Modern: cache hints per the spec's table.
    let m = json!({"_meta": modern_meta()});
    let list = s.ok("resources/list", m.clone());
    assert_eq!((list["ttlMs"].clone(), list["cacheScope"].clone()), (json!(300_000), json!("private")));
    let t = s.ok("resources/templates/list", m.clone());
    assert_eq!((t["ttlMs"].clone(), t["cacheScope"].clone()), (json!(300_000), json!("public")));
    let read = s.ok("resources/read", json!({"uri": "snowluma://onebot/actions", "_meta": modern_meta()}));
    assert_eq!((read["ttlMs"].clone(), read["cacheScope"].clone()), (json!(300_000), json!("public")));
    let missing = s.request("resources/read", json!({"uri": "snowluma://onebot/nothing", "_meta": modern_meta()}));
    assert_eq!(missing["error"]["code"], -32602, "modern resource-not-found: {missing}");
}
