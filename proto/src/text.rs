//! Text forms shared by the processes: canonical JSON (for digests) and
//! UTC calendar timestamps (without a date library).

use serde_json::Value;

/// Canonical JSON: object keys sorted at every level, so that equal values
/// digest equally whatever their key order.
pub fn canonical_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> =
                keys.iter().map(|k| format!("{}:{}", Value::String((*k).clone()), canonical_json(&m[*k]))).collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(canonical_json).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

/// `YYYY-MM-DDTHH:MM:SS` (UTC) of `secs` since the Unix epoch (Howard
/// Hinnant's civil-from-days); the caller appends fractions and `Z`.
pub fn utc_datetime(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}", rem / 3600, (rem / 60) % 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        assert_eq!(
            canonical_json(&json!({"b": 1, "a": [true, {"d": null, "c": "x"}]})),
            r#"{"a":[true,{"c":"x","d":null}],"b":1}"#
        );
    }

    #[test]
    fn calendar_dates() {
        assert_eq!(utc_datetime(0), "1970-01-01T00:00:00");
        assert_eq!(utc_datetime(951_782_400), "2000-02-29T00:00:00");
        assert_eq!(utc_datetime(1_796_083_199), "2026-11-30T23:59:59");
    }
}
