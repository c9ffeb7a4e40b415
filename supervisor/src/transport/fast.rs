//! The hot path's shortcuts around rmcp's generic message types, each
//! checked by a unit test against rmcp's own parse or bytes: `tools/call`
//! parsed straight into rmcp's `CallToolRequest`, and text-only tool results
//! written from borrowed fields.

use rmcp::RoleServer;
use rmcp::model::JsonRpcMessage;
use rmcp::service::RxJsonRpcMessage;
use serde_json::Value;

/// Where modern responses name this server in `_meta`.
pub(super) const SERVER_INFO_KEY: &str = "io.modelcontextprotocol/serverInfo";

/// A completed `tools/call` result of text blocks (what this server
/// produces), written straight from borrowed fields. rmcp's own
/// serialization of a result goes through intermediate `Value`s; this
/// writes the same JSON, field for field and in the same order, with
/// `serverInfo` appended to `_meta` for modern requests. `None` for any
/// other response, which takes the general path.
pub(super) fn fast_tool_response(
    r: &rmcp::model::JsonRpcResponse<rmcp::model::ServerResult>,
    server_info: Option<&Value>,
) -> Option<Vec<u8>> {
    use rmcp::model::{ContentBlock, ServerResult};
    use serde::ser::{SerializeMap, Serializer};

    struct Text<'a>(&'a str);
    impl serde::Serialize for Text<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut m = s.serialize_map(Some(2))?;
            m.serialize_entry("type", "text")?;
            m.serialize_entry("text", self.0)?;
            m.end()
        }
    }
    struct Meta<'a>(Option<&'a serde_json::Map<String, Value>>, Option<&'a Value>);
    impl serde::Serialize for Meta<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut m = s.serialize_map(None)?;
            for (k, v) in self.0.into_iter().flatten() {
                if self.1.is_none() || k != SERVER_INFO_KEY {
                    m.serialize_entry(k, v)?;
                }
            }
            if let Some(info) = self.1 {
                m.serialize_entry(SERVER_INFO_KEY, info)?;
            }
            m.end()
        }
    }
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Body<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        result_type: Option<&'a rmcp::model::ResultType>,
        content: Vec<Text<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        structured_content: Option<&'a Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        is_error: Option<bool>,
        #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
        meta: Option<Meta<'a>>,
    }
    #[derive(serde::Serialize)]
    struct Response<'a> {
        jsonrpc: &'static str,
        id: &'a rmcp::model::RequestId,
        result: Body<'a>,
    }

    let ServerResult::CallToolResult(res) = &r.result else { return None };
    let mut content = Vec::with_capacity(res.content.len());
    for block in &res.content {
        match block {
            ContentBlock::Text(t) if t.meta.is_none() && t.annotations.is_none() => content.push(Text(&t.text)),
            _ => return None,
        }
    }
    let meta = match (&res.meta, server_info) {
        (None, None) => None,
        (m, info) => Some(Meta(m.as_ref().map(|m| &m.0), info)),
    };
    let out = Response {
        jsonrpc: "2.0",
        id: &r.id,
        result: Body {
            result_type: res.result_type.as_ref(),
            content,
            structured_content: res.structured_content.as_ref(),
            is_error: res.is_error,
            meta,
        },
    };
    // One buffer sized once: the text escaped (its newlines and quotes grow
    // it), the structured result (about the text's size, unindented) and
    // the envelope around them.
    let text_len: usize = out.result.content.iter().map(|t| t.0.len()).sum();
    let mut buf = Vec::with_capacity(text_len * 5 / 2 + 512);
    serde_json::to_writer(&mut buf, &out).ok()?;
    Some(buf)
}

/// A `tools/call`'s `arguments`, kept as the client's JSON text: the
/// supervisor forwards most of them unread (a documentation tool's to the
/// catalog worker, `params` to the network executor), and a parsed tree of
/// them would take many times their size (an array of zeros, 40 times).
/// Present in the request's extensions instead of rmcp's `arguments`.
#[derive(Debug, Clone)]
pub struct RawArguments(pub std::sync::Arc<serde_json::value::RawValue>);

/// `tools/call`, the hot path, parsed straight into its rmcp type. rmcp's
/// generic message type is an untagged enum that tries each request kind in
/// turn (buffering the message and building an error for every miss); this
/// builds the same value directly: `params._meta` moves into the request's
/// extensions, exactly as rmcp's own parse leaves it, and `arguments` (an
/// object) into them as [`RawArguments`], unparsed. `None` (malformed
/// params) falls back to the generic parse and its error reporting.
pub(super) fn parse_call_tool(line: &[u8]) -> Option<RxJsonRpcMessage<RoleServer>> {
    use serde_json::value::RawValue;
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Params<'a> {
        #[serde(rename = "_meta", default)]
        meta: Option<rmcp::model::RequestMetaObject>,
        name: String,
        #[serde(borrow, default)]
        arguments: Option<&'a RawValue>,
        #[serde(default)]
        input_responses: Option<rmcp::model::InputResponses>,
        #[serde(default)]
        request_state: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Call<'a> {
        id: rmcp::model::RequestId,
        #[serde(borrow)]
        params: Params<'a>,
    }
    let Call { id, params: p } = serde_json::from_slice(line).ok()?;
    // rmcp's arguments are an object (or absent, or null).
    let arguments = match p.arguments {
        Some(raw) if raw.get().starts_with('{') => Some(RawArguments(std::sync::Arc::from(raw.to_owned()))),
        Some(raw) if raw.get() == "null" => None,
        None => None,
        Some(_) => return None,
    };
    let mut params = rmcp::model::CallToolRequestParams::new(p.name);
    params.input_responses = p.input_responses;
    params.request_state = p.request_state;
    let mut request = rmcp::model::CallToolRequest::new(params);
    if let Some(meta) = p.meta {
        request.extensions.insert(meta);
    }
    if let Some(raw) = arguments {
        request.extensions.insert(raw);
    }
    Some(JsonRpcMessage::Request(rmcp::model::JsonRpcRequest::new(
        id,
        rmcp::model::ClientRequest::CallToolRequest(request),
    )))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A parsed `tools/call`'s arguments as rmcp would hold them: from
    /// [`RawArguments`] in the extensions when the fast parse took them, else
    /// rmcp's own.
    fn arguments(
        params: &rmcp::model::CallToolRequestParams,
        extensions: &rmcp::model::Extensions,
    ) -> Option<serde_json::Map<String, Value>> {
        match extensions.get::<RawArguments>() {
            Some(raw) => serde_json::from_str(raw.0.get()).ok(),
            None => params.arguments.clone(),
        }
    }

    /// The fast `tools/call` parse yields exactly what rmcp's generic parse
    /// does: same request, same params, same `_meta` in the extensions.
    #[test]
    fn fast_tools_call_parse_matches_rmcp() {
        use rmcp::model::{ClientRequest, RequestMetaObject};
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"query_action","arguments":{"action":"get_status"}}}"#,
            r#"{"jsonrpc":"2.0","id":"a-b","method":"tools/call","params":{"name":"x","arguments":{"n":1.5,"big":18446744073709551615,"s":"\u00e9"},"_meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","progressToken":7,"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"y","requestState":"abc","_meta":{}}}"#,
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"z","arguments":null,"inputResponses":{"a":{"action":"accept"}}}}"#,
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"z","arguments":{"p":{"a":[0,0,{"b":"\"}"}]}}}}"#,
        ] {
            let mut fast = parse_call_tool(line.as_bytes()).expect("fast parse");
            let slow: RxJsonRpcMessage<RoleServer> = serde_json::from_str(line).unwrap();
            // The arguments, kept as text, parse to exactly rmcp's.
            if let JsonRpcMessage::Request(r) = &mut fast
                && let ClientRequest::CallToolRequest(c) = &mut r.request
            {
                c.params.arguments = arguments(&c.params, &c.extensions);
            }
            assert_eq!(serde_json::to_value(&fast).unwrap(), serde_json::to_value(&slow).unwrap(), "{line}");
            let parts = |m: &RxJsonRpcMessage<RoleServer>| match m {
                JsonRpcMessage::Request(r) => match &r.request {
                    ClientRequest::CallToolRequest(c) => {
                        (r.id.clone(), c.params.clone(), c.extensions.get::<RequestMetaObject>().cloned())
                    }
                    _ => panic!("not a tools/call"),
                },
                _ => panic!("not a request"),
            };
            assert_eq!(parts(&fast), parts(&slow), "{line}");
        }
        // Params that are not a tools/call shape are left to the generic parse.
        assert!(parse_call_tool(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"x"}"#).is_none());
        assert!(
            parse_call_tool(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{}}}"#).is_none()
        );
        assert!(
            parse_call_tool(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":[1]}}"#)
                .is_none()
        );
    }

    /// The direct writer of tool results produces exactly rmcp's JSON
    /// (legacy), and rmcp's JSON with serverInfo added to `_meta` (modern).
    #[test]
    fn fast_tool_response_matches_rmcp() {
        use rmcp::model::{CallToolResult, ContentBlock, JsonRpcResponse, MetaObject, ServerResult};
        let info = json!({"name": "snowluma-mcp", "version": "1"});
        let mut with_meta = CallToolResult::success(vec![ContentBlock::text("{\n  \"a\": \"é\\n\"\n}")]);
        with_meta.structured_content =
            Some(json!({"result": {"a": 1, "b": [null, -5, 1.5]}, "diagnostics": {"outcome": "success"}}));
        let mut m = MetaObject::new();
        m.insert("traceparent".into(), json!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        with_meta.meta = Some(m);
        let mut error = CallToolResult::error(vec![ContentBlock::text("boom")]);
        error.structured_content =
            Some(json!({"result": null, "diagnostics": {"outcome": "failed", "kind": "transport"}}));
        let mut legacy = CallToolResult::success(vec![]);
        legacy.result_type = None;
        for (n, result) in [with_meta, error, legacy].into_iter().enumerate() {
            let resp = JsonRpcResponse {
                jsonrpc: rmcp::model::JsonRpcVersion2_0,
                id: rmcp::model::NumberOrString::Number(n as i64),
                result: ServerResult::CallToolResult(result),
            };
            let fast = fast_tool_response(&resp, None).expect("text-only result");
            let rmcp_bytes = serde_json::to_vec(&JsonRpcMessage::<
                rmcp::model::ServerRequest,
                _,
                rmcp::model::ServerNotification,
            >::Response(resp.clone()))
            .unwrap();
            assert_eq!(String::from_utf8(fast).unwrap(), String::from_utf8(rmcp_bytes.clone()).unwrap(), "case {n}");
            let modern = fast_tool_response(&resp, Some(&info)).unwrap();
            let mut expect: Value = serde_json::from_slice(&rmcp_bytes).unwrap();
            if let Value::Object(m) =
                expect["result"].as_object_mut().unwrap().entry("_meta").or_insert_with(|| json!({}))
            {
                m.insert(SERVER_INFO_KEY.into(), info.clone());
            }
            assert_eq!(String::from_utf8(modern).unwrap(), serde_json::to_string(&expect).unwrap(), "modern case {n}");
        }
        // Anything but text blocks is left to rmcp.
        let resp = JsonRpcResponse {
            jsonrpc: rmcp::model::JsonRpcVersion2_0,
            id: rmcp::model::NumberOrString::Number(9),
            result: ServerResult::CallToolResult(CallToolResult::success(vec![ContentBlock::image(
                "AAAA",
                "image/png",
            )])),
        };
        assert!(fast_tool_response(&resp, None).is_none());
    }
}
