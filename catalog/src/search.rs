//! Matching for `search_actions`.
//!
//! * `substring` (the default and the original behaviour, as Node's): the
//!   whole query, lower-cased, is a substring of the lower-cased name,
//!   upstream summary or one alias; results keep catalog order. An empty
//!   query matches everything.
//! * `keywords`: space-separated terms combined with AND (at most
//!   [`MAX_TERMS`]); each term matches as a substring, and also matches its
//!   synonyms from a small Chinese/English table, English synonyms as whole
//!   words only (so that `mute`'s synonym `ban` finds `set_group_ban` but
//!   not "banner"); exact names and aliases rank first, then matches in
//!   names, then the rest, each group in catalog order.
//!
//! A query is parsed once per request ([`SubstringQuery`],
//! [`KeywordQuery`]); the actions' lower-cased texts are computed once per
//! process ([`Action::search_text`]).

use crate::Action;

/// Groups of interchangeable search terms. Kept small on purpose: each entry
/// should be a word an operator would actually type.
const SYNONYMS: &[&[&str]] = &[
    &["群", "group", "qun"],
    &["好友", "friend", "buddy"],
    &["禁言", "ban", "mute"],
    &["踢", "踢人", "kick"],
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

/// Most terms a keyword query may have: each term costs a pass over the
/// catalog, and no real query needs more.
pub const MAX_TERMS: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("keywords 模式的查询最多 {max} 个关键词（收到 {given} 个）。")]
    TooManyTerms { given: usize, max: usize },
}

/// One way a term can match.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Alt {
    text: String,
    /// Only between non-alphanumeric characters (an English synonym).
    whole_word: bool,
}

impl Alt {
    fn found_in(&self, hay: &str) -> bool {
        if !self.whole_word {
            return hay.contains(&self.text);
        }
        let is_word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric());
        hay.match_indices(&self.text)
            .any(|(i, m)| !is_word(hay[..i].chars().next_back()) && !is_word(hay[i + m.len()..].chars().next()))
    }
}

/// A term and its synonyms. The term itself matches as a substring (the
/// original behaviour); a synonym that is a Latin word matches whole words
/// only, a Chinese one as a substring (Chinese has no spaces between words).
fn expand(term: &str) -> Vec<Alt> {
    let mut out = vec![Alt { text: term.to_owned(), whole_word: false }];
    for group in SYNONYMS {
        if group.iter().any(|g| g.to_lowercase() == term) {
            for g in group.iter().map(|g| g.to_lowercase()) {
                if g != term && !out.iter().any(|a| a.text == g) {
                    let whole_word = g.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                    out.push(Alt { text: g, whole_word });
                }
            }
        }
    }
    out
}

/// The lower-cased texts a query is matched against, rendered at build
/// time ([`crate::index`]).
#[derive(Debug, Clone)]
pub struct SearchText {
    pub(crate) name: &'static str,
    pub(crate) aliases: &'static [&'static str],
    /// Upstream's summary ("" when it has none).
    pub(crate) summary: &'static str,
    pub(crate) summary_en: &'static str,
}

/// Node's matching rule, with the query lower-cased once: a substring of
/// the name, the upstream summary or one of the aliases.
#[derive(Debug)]
pub struct SubstringQuery(String);

impl SubstringQuery {
    pub fn new(query: &str) -> SubstringQuery {
        SubstringQuery(query.to_lowercase())
    }

    pub fn matches(&self, a: &Action) -> bool {
        let t = &a.search_text;
        t.name.contains(&self.0)
            || t.summary.contains(&self.0)
            || t.aliases.iter().any(|al| al.contains(self.0.as_str()))
    }
}

/// A parsed keyword query.
#[derive(Debug)]
pub struct KeywordQuery {
    whole: String,
    terms: Vec<Vec<Alt>>,
}

impl KeywordQuery {
    pub fn parse(query: &str) -> Result<KeywordQuery, QueryError> {
        let whole = query.trim().to_lowercase();
        let given = whole.split_whitespace().count();
        if given > MAX_TERMS {
            return Err(QueryError::TooManyTerms { given, max: MAX_TERMS });
        }
        let terms = whole.split_whitespace().map(expand).collect();
        Ok(KeywordQuery { whole, terms })
    }

    /// Rank of `a`, or `None` when some term does not match. Lower ranks
    /// come first: the group (exact name, all terms in the name, the rest),
    /// then the name's number of words, so that within a group the most
    /// general action (`set_group_ban`) precedes its variants
    /// (`set_group_anonymous_ban`); ties keep catalog order.
    pub fn rank(&self, a: &Action) -> Option<(u8, usize)> {
        let words = a.name.split('_').filter(|w| !w.is_empty()).count();
        self.group(a).map(|g| (g, words))
    }

    fn group(&self, a: &Action) -> Option<u8> {
        if self.terms.is_empty() {
            return Some(2);
        }
        let text = &a.search_text;
        if text.name == self.whole || text.aliases.contains(&self.whole.as_str()) {
            return Some(0);
        }
        let mut all_in_name = true;
        for alts in &self.terms {
            let in_name = alts.iter().any(|t| t.found_in(text.name) || text.aliases.iter().any(|al| t.found_in(al)));
            let anywhere = in_name || alts.iter().any(|t| t.found_in(text.summary) || t.found_in(text.summary_en));
            if !anywhere {
                return None;
            }
            all_in_name &= in_name;
        }
        Some(if all_in_name { 1 } else { 2 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Catalog;

    fn top(query: &str, n: usize) -> Vec<String> {
        let q = KeywordQuery::parse(query).unwrap();
        let mut ranked: Vec<((u8, usize), usize, &str)> = Catalog::bundled()
            .actions
            .iter()
            .enumerate()
            .filter_map(|(i, a)| q.rank(a).map(|r| (r, i, a.name)))
            .collect();
        ranked.sort_by_key(|(r, i, _)| (*r, *i));
        ranked.into_iter().take(n).map(|(_, _, name)| name.to_owned()).collect()
    }

    #[test]
    fn synonyms_match_whole_words_only() {
        let ban = Alt { text: "ban".into(), whole_word: true };
        assert!(ban.found_in("set_group_ban"));
        assert!(ban.found_in("ban a member"));
        assert!(!ban.found_in("banner"));
        assert!(!ban.found_in("urban"));
        let sub = Alt { text: "ban".into(), whole_word: false };
        assert!(sub.found_in("banner"), "the typed term itself still matches as a substring");
        // A Chinese synonym is a substring match.
        assert!(expand("mute").iter().any(|a| a.text == "禁言" && !a.whole_word));
    }

    /// The everyday queries an operator types, in Chinese and English: the
    /// action they are after comes first (or among the first), and nothing
    /// unrelated is pulled in by a synonym inside another word.
    #[test]
    fn everyday_queries_find_the_right_actions() {
        let cases: &[(&str, &[&str], &[&str])] = &[
            // (query, expected at the top in this order, must not appear)
            ("禁言", &["set_group_ban"], &["bot_exit"]),
            ("mute", &["set_group_ban"], &["bot_exit"]),
            ("踢", &["set_group_kick", "set_group_kick_members"], &["delete_friend"]),
            ("撤回", &["delete_msg"], &[]),
            ("好友 列表", &["get_friend_list"], &[]),
            ("发送 群 消息", &["send_group_msg"], &[]),
            ("点赞", &["send_like"], &[]),
            ("status", &["get_status"], &["bot_exit"]),
            ("群 成员 列表", &["get_group_member_list"], &[]),
            ("download", &["download_file_stream"], &[]),
            ("上传 群 文件", &["upload_group_file"], &[]),
            ("recall", &["delete_msg"], &[]),
        ];
        for (query, expect, never) in cases {
            let got = top(query, 10);
            for (i, name) in expect.iter().enumerate() {
                let pos = got.iter().position(|g| g == name);
                assert!(pos.is_some_and(|p| p <= i + 2), "{query}: {name} should be among the first, got {got:?}");
            }
            let all = top(query, 193);
            for name in *never {
                assert!(!all.iter().any(|g| g == name), "{query}: {name} must not match, got {all:?}");
            }
        }
    }

    #[test]
    fn too_many_terms_is_an_error() {
        let q = vec!["a"; MAX_TERMS].join(" ");
        assert!(KeywordQuery::parse(&q).is_ok());
        let q = vec!["a"; MAX_TERMS + 1].join(" ");
        assert_eq!(
            KeywordQuery::parse(&q).unwrap_err(),
            QueryError::TooManyTerms { given: MAX_TERMS + 1, max: MAX_TERMS }
        );
    }
}
