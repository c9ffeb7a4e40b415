//! Matching for `search_actions`.
//!
//! * `substring` (the default and the original behaviour): the whole query,
//!   case-insensitively, is a substring of the name, a summary or an alias;
//!   results keep catalog order. An empty query matches everything.
//! * `keywords`: space-separated terms combined with AND; each term also
//!   matches its synonyms from a small Chinese/English table; exact names
//!   and aliases rank first, then matches in names, then the rest, each
//!   group in catalog order.

use crate::Action;

/// Groups of interchangeable search terms. Kept small on purpose: each entry
/// should be a word an operator would actually type.
const SYNONYMS: &[&[&str]] = &[
    &["群", "group", "qun"],
    &["好友", "friend", "buddy"],
    &["禁言", "ban", "mute", "shut"],
    &["踢", "踢人", "kick", "remove"],
    &["消息", "message", "msg"],
    &["发送", "发", "send", "post"],
    &["撤回", "recall", "delete_msg"],
    &["删除", "delete", "del"],
    &["文件", "file"],
    &["上传", "upload"],
    &["下载", "download"],
    &["头像", "avatar", "portrait"],
    &["名片", "card", "nickname"],
    &["管理员", "admin", "administrator"],
    &["公告", "notice", "announcement"],
    &["精华", "essence"],
    &["戳", "戳一戳", "poke", "nudge"],
    &["点赞", "like"],
    &["相册", "album", "photo"],
    &["空间", "qzone", "说说"],
    &["请求", "申请", "request"],
    &["状态", "status"],
    &["登录", "login", "account"],
    &["版本", "version"],
    &["图片", "image", "picture", "photo"],
    &["语音", "record", "voice", "ptt"],
    &["历史", "history"],
    &["成员", "member"],
    &["列表", "list"],
    &["信息", "info", "information"],
    &["退群", "leave", "quit"],
    &["全员", "whole", "all"],
    &["表情", "emoji", "face", "sticker"],
    &["转发", "forward"],
    &["签到", "sign", "checkin"],
    &["资料", "profile"],
    &["备注", "remark"],
    &["头衔", "title"],
    &["流", "流式", "stream"],
    &["已读", "read", "mark"],
    &["加群", "add"],
];

fn expand(term: &str) -> Vec<String> {
    let t = term.to_lowercase();
    let mut out = vec![t.clone()];
    for group in SYNONYMS {
        if group.iter().any(|g| g.to_lowercase() == t) {
            out.extend(group.iter().map(|g| g.to_lowercase()));
        }
    }
    out.sort();
    out.dedup();
    out
}

fn haystacks(a: &Action) -> [String; 4] {
    [a.name.to_lowercase(), a.aliases.join(" ").to_lowercase(), a.summary.to_lowercase(), a.summary_zh.to_lowercase()]
}

/// The original matching rule.
pub fn substring_match(a: &Action, query: &str) -> bool {
    let q = query.to_lowercase();
    q.is_empty() || haystacks(a).iter().any(|h| h.contains(&q))
}

/// Rank of `a` for a keyword query, or `None` when some term does not match.
/// Lower ranks come first.
pub fn keyword_rank(a: &Action, query: &str) -> Option<u8> {
    let q = query.trim().to_lowercase();
    let terms: Vec<Vec<String>> = q.split_whitespace().map(expand).collect();
    if terms.is_empty() {
        return Some(2);
    }
    if a.name.to_lowercase() == q || a.aliases.iter().any(|al| al.to_lowercase() == q) {
        return Some(0);
    }
    let [name, aliases, summary, summary_zh] = haystacks(a);
    let mut all_in_name = true;
    for alts in &terms {
        let in_name = alts.iter().any(|t| name.contains(t) || aliases.contains(t));
        let anywhere = in_name || alts.iter().any(|t| summary.contains(t) || summary_zh.contains(t));
        if !anywhere {
            return None;
        }
        all_in_name &= in_name;
    }
    Some(if all_in_name { 1 } else { 2 })
}
