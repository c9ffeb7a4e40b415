//! The Node server's user-visible texts that more than one process needs
//! (`shared/reference/upstream/node-texts.tsv` holds every one of them and
//! says when each appears). A text used in one place only stays beside the
//! code that produces it, in the same words.

/// `err.exec.call_failed`: the tool error text of every failure of an
/// execution once it has started (the network executor's and the file
/// transfers' errors). `action` is the action as the caller wrote it
/// (an alias stays an alias); `detail` is the client error's own message.
pub fn call_failed(action: &str, detail: &str) -> String {
    format!("调用失败 ({action}): {detail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_failed_is_nodes_prefix() {
        assert_eq!(
            call_failed("get_msg", "action get_msg request: fetch failed"),
            "调用失败 (get_msg): action get_msg request: fetch failed"
        );
    }
}
