//! What the catalog says about an action for the operator's safety gates
//! (target scope and send pacing), beside upstream's `role` / `x-role`
//! marks: which actions send or broadcast, the targets upstream leaves
//! unmarked, and the actions whose results or effects span every chat.
//! Each list names catalog actions only (a test checks it); nothing is
//! guessed from a parameter's name.

use serde_json::Value;

use crate::Action;

/// Which kind of target a parameter names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TargetKind {
    /// A group number.
    Group,
    /// A QQ number (a friend, a stranger or a group member).
    User,
    /// A message id (signed 32-bit), whose chat is not named.
    Message,
}

impl TargetKind {
    /// The kind of an upstream `role` (`x-role`), if it names a target.
    pub fn of_role(role: &str) -> Option<TargetKind> {
        match role {
            "group_id" => Some(TargetKind::Group),
            "user_id" | "member_id" => Some(TargetKind::User),
            "message_id" => Some(TargetKind::Message),
            _ => None,
        }
    }
}

/// Actions that send or broadcast something other people see: messages,
/// forwards, pokes, likes, group notices, files posted to a chat, qzone
/// posts and comments. These are paced.
pub const SENDS: &[&str] = &[
    "send_msg",
    "send_group_msg",
    "send_private_msg",
    "send_forward_msg",
    "send_group_forward_msg",
    "send_private_forward_msg",
    "forward_friend_single_msg",
    "forward_group_single_msg",
    "send_like",
    "send_poke",
    "group_poke",
    "friend_poke",
    "_send_group_notice",
    "send_flash_msg",
    "send_group_ai_record",
    "send_tuwen_ark",
    "upload_group_file",
    "upload_private_file",
    "set_group_sign",
    "send_qzone_msg",
    "comment_qzone",
    "do_group_album_comment",
    "click_inline_keyboard_button",
];

/// Targets upstream's catalog does not mark with a role: `(action,
/// parameter, kind)`. A parameter holding an array names each element.
pub const UNMARKED_TARGETS: &[(&str, &str, TargetKind)] = &[
    // The temporary-session source group.
    ("send_private_msg", "group_id", TargetKind::Group),
    // Free-form extra params read from the raw request.
    ("send_forward_msg", "group_id", TargetKind::Group),
    ("send_forward_msg", "user_id", TargetKind::User),
    // An array of members.
    ("set_group_kick_members", "user_id", TargetKind::User),
    // Visibility lists of QQ numbers.
    ("send_qzone_msg", "target_uins", TargetKind::User),
    ("set_qzone_msg_right", "target_uins", TargetKind::User),
];

/// Actions whose `message_id` is a position inside the chat the action
/// names (a history cursor), not a message of its own.
pub const MESSAGE_CURSORS: &[&str] = &["get_group_msg_history", "get_friend_msg_history"];

/// Actions whose result or effect spans chats and that a target scope
/// therefore refuses unless a marked target narrows them to one: the
/// recent-contact list (it carries each chat's last message), system and
/// request lists, request handling by opaque flag, marking every chat read,
/// the friends' qzone feed, and raw packets (whose targets cannot be read).
pub const SPANNING: &[&str] = &[
    "get_recent_contact",
    "get_group_system_msg",
    "get_group_ignored_notifies",
    "get_group_ignore_add_request",
    "get_doubt_friends_add_request",
    "set_doubt_friends_add_request",
    "set_friend_add_request",
    "set_group_add_request",
    "_mark_all_as_read",
    "get_qzone_feeds",
    // Raw protocol packets (default-deny): their targets cannot be read.
    "send_packet",
];

/// Actions that name no group, user or message (no marked or unmarked
/// target, no `message` parameter) and do not span chats: a target scope
/// lets them run (README, "Target scope", says why for each kind). Every
/// catalog action is targeted, in [`SPANNING`], or here, so an action
/// upstream adds is decided, never let through silently (a test).
pub const UNTARGETED: &[&str] = &[
    "_get_model_show",
    "_set_model_show",
    ".get_word_slices",
    "add_custom_face",
    "bot_exit",
    "can_send_image",
    "can_send_record",
    "check_url_safely",
    "clean_cache",
    "clean_stream_temp_file",
    "create_collection",
    "create_flash_task",
    "delete_custom_face",
    "delete_flash_file",
    "delete_qzone_msg",
    "download_file",
    "download_file_image_stream",
    "download_file_record_stream",
    "download_file_stream",
    "download_fileset",
    "fetch_custom_face",
    "fetch_custom_face_detail",
    "fetch_face_entity",
    "fetch_super_face_id",
    "fetch_sys_faces",
    "get_clientkey",
    "get_collection_list",
    "get_cookies",
    "get_credentials",
    "get_csrf_token",
    "get_file",
    "get_fileset_id",
    "get_fileset_info",
    "get_flash_file_list",
    "get_flash_file_url",
    "get_forward_msg",
    "get_friend_list",
    "get_friends_with_category",
    "get_group_list",
    "get_image",
    "get_login_info",
    "get_mini_app_ark",
    "get_online_clients",
    "get_record",
    "get_rkey",
    "get_rkey_server",
    "get_share_link",
    "get_status",
    "get_unidirectional_friend_list",
    "get_version_info",
    "list_filesets",
    "modify_custom_face",
    "move_custom_face_to_front",
    "nc_get_packet_status",
    "ocr_image",
    "rename_flash_file",
    "request_decrypt_key",
    "search_sys_faces",
    "set_diy_online_status",
    "set_group_anonymous",
    "set_group_anonymous_ban",
    "set_online_status",
    "set_qq_avatar",
    "set_qq_profile",
    "set_restart",
    "set_self_longnick",
    "test_download_stream",
    "translate_en2zh",
    "upload_file_stream",
];

/// Whether the action sends or broadcasts ([`SENDS`]).
pub fn sends(action: &Action) -> bool {
    SENDS.contains(&action.name)
}

/// Whether the action's result or effect spans chats ([`SPANNING`]).
pub fn spans(action: &Action) -> bool {
    SPANNING.contains(&action.name)
}

/// Whether the action's `message_id` is a cursor in the chat it names.
pub fn message_cursor(action: &Action) -> bool {
    MESSAGE_CURSORS.contains(&action.name)
}

/// Every parameter of the action that names a target: upstream's marked
/// ones (`params[].role`), then [`UNMARKED_TARGETS`]; and the parameters
/// of type `message` (whose segments may name users or messages).
pub fn targets(action: &Action) -> (Vec<(&str, TargetKind)>, Vec<&str>) {
    let mut marked = Vec::new();
    let mut messages = Vec::new();
    for p in action.doc().get("params").and_then(Value::as_array).into_iter().flatten() {
        let Some(name) = p.get("name").and_then(Value::as_str) else { continue };
        if let Some(kind) = p.get("role").and_then(Value::as_str).and_then(TargetKind::of_role) {
            marked.push((name, kind));
        }
        if p.get("type").and_then(Value::as_str) == Some("message") {
            messages.push(name);
        }
    }
    for (a, param, kind) in UNMARKED_TARGETS {
        if *a == action.name && !marked.iter().any(|(n, _)| n == param) {
            marked.push((param, *kind));
        }
    }
    (marked, messages)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::Catalog;

    #[test]
    fn every_listed_action_and_parameter_is_in_the_catalog() {
        let c = Catalog::bundled();
        let names = SENDS.iter().chain(SPANNING).chain(MESSAGE_CURSORS).chain(UNTARGETED);
        for n in names {
            assert!(c.actions.iter().any(|a| a.name == *n), "{n} is not a catalog action");
        }
        for (a, p, _) in UNMARKED_TARGETS {
            let action = c.actions.iter().find(|x| x.name == *a).unwrap();
            let known = action.doc()["params"].as_array().unwrap().iter().any(|x| x["name"] == *p);
            // send_forward_msg's targets are free-form (not in its params).
            assert!(known || *a == "send_forward_msg", "{a}.{p}");
        }
    }

    #[test]
    fn targets_come_from_roles_and_the_unmarked_table() {
        let c = Catalog::bundled();
        let get = |n: &str| c.actions.iter().find(|a| a.name == n).unwrap();
        let (t, m) = targets(get("send_msg"));
        assert_eq!(t, vec![("group_id", TargetKind::Group), ("user_id", TargetKind::User)]);
        assert_eq!(m, vec!["message"]);
        let (t, _) = targets(get("group_poke"));
        assert_eq!(t, vec![("group_id", TargetKind::Group), ("user_id", TargetKind::User)], "member_id is a user");
        let (t, _) = targets(get("set_group_kick_members"));
        assert!(t.contains(&("user_id", TargetKind::User)));
        let (t, m) = targets(get("send_forward_msg"));
        assert_eq!((t.len(), m), (2, vec!["messages", "message"]));
        assert!(targets(get("get_group_list")).0.is_empty());
        assert!(sends(get("send_like")) && !sends(get("get_status")));
    }

    /// No silent gap: every catalog action names a target the scope checks,
    /// spans chats (refused under a scope), or is decided as untargeted;
    /// an untargeted one names no target after all.
    #[test]
    fn every_action_is_decided_for_the_scope() {
        for a in Catalog::bundled().actions {
            let (marked, messages) = targets(a);
            let targeted = !marked.is_empty() || !messages.is_empty();
            let decided = targeted || spans(a) || UNTARGETED.contains(&a.name);
            assert!(decided, "{}: no target, not spanning, not in UNTARGETED: decide it", a.name);
            assert!(!(targeted && UNTARGETED.contains(&a.name)), "{} names a target", a.name);
        }
    }
}
