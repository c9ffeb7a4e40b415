//! The closing diagnostic line of each tool call (`tool call`, with its
//! outcome and duration), held for a moment so that many share a write.
//!
//! Formatting that line and writing it to stderr (a system call) came
//! between the network executor's answer and the client's, then right
//! after the answer, on the same processor the client was woken on: a
//! microsecond or more of every call. Now a finished call's line is held
//! and the held lines are written together, in the order they were held,
//! by the flusher ([`flusher`]) [`HOLD_FOR`] after the first of
//! them, or at once when [`MAX_HELD`] are held, and at the session's end
//! ([`write_held`]). A call the client cancelled gets no answer (rmcp
//! drops it), so its line is written at once, after the held ones
//! ([`write_now`]). Nothing is lost or reordered; a line that finds the
//! store unusable is written at once. A direct call's lines ([`Closing`])
//! are taken when its reply is known and held only once its answer is
//! written: the client's answer does not wait for them.

use std::io::Write as _;
use std::sync::Mutex;
use std::time::SystemTime;

/// Most lines held at once: about 3 KiB, under the 4 KiB a pipe takes
/// in one piece.
pub(crate) const MAX_HELD: usize = 16;

/// How long a closing line waits for others to share its write.
pub(crate) const HOLD_FOR: std::time::Duration = std::time::Duration::from_millis(10);

/// Wakes the flusher: a first line is held.
static FLUSH: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// What the line of a finished call says: never arguments, contents,
/// tokens or paths.
pub(crate) struct Line {
    pub(crate) tool: &'static str,
    pub(crate) traceparent: String,
    pub(crate) outcome: &'static str,
    pub(crate) failure: &'static str,
    pub(crate) duration_ms: f64,
}

impl Line {
    /// The line as every other diagnostic line is written (the full
    /// format of `tracing_subscriber`, as `snowluma_logsink` sets it up:
    /// no colours, no target), written here without going through tracing:
    /// formatting it there took a tenth of the supervisor's time per call.
    /// `<time>  INFO tool call tool="…" traceparent=… outcome="…"
    /// failure="…" duration_ms=…`, newline included.
    fn render(&self, now: SystemTime, out: &mut Vec<u8>) {
        timestamp(now, out);
        out.extend_from_slice(b"  INFO tool call tool=");
        quoted(self.tool, out);
        out.extend_from_slice(b" traceparent=");
        out.extend_from_slice(self.traceparent.as_bytes());
        out.extend_from_slice(b" outcome=");
        quoted(self.outcome, out);
        out.extend_from_slice(b" failure=");
        quoted(self.failure, out);
        // tracing records an f64 field with `Debug`.
        let _ = writeln!(out, " duration_ms={:?}", self.duration_ms);
    }
}

/// A string field as tracing writes it (`Debug`: quoted, escaped); the
/// names and outcomes written here are plain ASCII words, written as they
/// are.
fn quoted(s: &str, out: &mut Vec<u8>) {
    if s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        let _ = write!(out, "{s:?}");
    }
}

/// `now` as tracing_subscriber's `SystemTime` timer writes it (RFC 3339,
/// UTC, microseconds): `2026-12-05T12:05:08.398134Z`. The part up to the
/// second is kept from the last line (lines come many per second).
fn timestamp(now: SystemTime, out: &mut Vec<u8>) {
    use std::cell::Cell;
    thread_local! {
        static SECOND: Cell<Option<(u64, [u8; 19])>> = const { Cell::new(None) };
    }
    let since = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let prefix = match SECOND.get() {
        Some((s, prefix)) if s == secs => prefix,
        _ => {
            let (days, rem) = (secs / 86_400, secs % 86_400);
            let (year, month, day) = civil_from_days(days as i64);
            // tracing marks a year beyond 9999 with a sign.
            let sign = if year > 9999 { "+" } else { "" };
            let text =
                format!("{sign}{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}", rem / 3600, rem / 60 % 60, rem % 60);
            // Years beyond 9999 (never on a live clock) are not kept.
            let Ok(prefix) = <[u8; 19]>::try_from(text.as_bytes()) else {
                out.extend_from_slice(text.as_bytes());
                return micros(since.subsec_micros(), out);
            };
            SECOND.set(Some((secs, prefix)));
            prefix
        }
    };
    out.extend_from_slice(&prefix);
    micros(since.subsec_micros(), out);
}

/// `.uuuuuuZ`.
fn micros(us: u32, out: &mut Vec<u8>) {
    let mut digits = *b".000000Z";
    let mut n = us;
    for d in digits[1..7].iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
    out.extend_from_slice(&digits);
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Lines waiting for their call's answer to be written.
pub(crate) struct Held {
    lines: Mutex<Vec<Line>>,
    /// Where a rendered line goes (stderr's sink; a buffer in tests).
    sink: fn(&[u8]),
}

/// The process's store (a session is one process).
static HELD: Held = Held::new();

impl Held {
    pub(crate) const fn new() -> Held {
        Held { lines: Mutex::new(Vec::new()), sink: snowluma_logsink::write_line }
    }

    /// Keep `line` until [`Held::write_all`]; every held line is written
    /// at once when it makes [`MAX_HELD`]. How many are held now (0: it
    /// was written).
    pub(crate) fn hold(&self, line: Line) -> usize {
        let held = match self.lines.lock() {
            Ok(mut held) => {
                held.push(line);
                held.len()
            }
            Err(_) => {
                self.write_now(line);
                return 0;
            }
        };
        if held >= MAX_HELD {
            self.write_all();
            return 0;
        }
        held
    }

    /// Write the line of a call that gets no answer, after the held ones.
    pub(crate) fn write_now(&self, line: Line) {
        self.write_all();
        let mut buf = Vec::with_capacity(192);
        line.render(SystemTime::now(), &mut buf);
        (self.sink)(&buf);
    }

    /// Write every held line, oldest first, together (the lines of calls
    /// answered in one stdout write go out in one stderr write).
    pub(crate) fn write_all(&self) {
        if let Ok(mut held) = self.lines.lock() {
            if held.is_empty() {
                return;
            }
            // Written under the lock so that two writers keep the order;
            // a diagnostic write never waits (`snowluma_logsink`).
            let now = SystemTime::now();
            let mut buf = Vec::with_capacity(192 * held.len());
            snowluma_logsink::together(|| {
                for line in held.drain(..) {
                    buf.clear();
                    line.render(now, &mut buf);
                    (self.sink)(&buf);
                }
            });
        }
    }
}

/// A tool call has finished: its log lines, never arguments, contents,
/// tokens or paths. Its trace diagnostic, if any, at once; its closing line
/// held for its answer, or written at once when it was `cancelled` (it gets
/// no answer). Both with the target they always had.
pub(crate) fn finished(
    spec: crate::tools::ToolSpec,
    trace: &crate::trace::CallTrace,
    reply: &snowluma_proto::ToolReply,
    started: std::time::Instant,
    cancelled: bool,
) {
    diagnose(spec.name, trace);
    let line =
        || Line::of(spec.name, trace.traceparent.clone(), outcome_failure(&reply.diagnostics), started.elapsed());
    if cancelled {
        write_now(line);
    } else {
        hold(line);
    }
}

/// A finished call's log lines, taken when its reply is known (its
/// outcome, its duration then) and written or held later: a direct call's
/// once its answer is written, so that neither costs the client's wait for
/// the answer (PERFORMANCE.md, "Latency and throughput", the thirteenth sitting).
/// It owns the call's trace: its line takes the traceparent, uncopied, and
/// is made only when info lines are on.
pub(crate) struct Closing {
    tool: &'static str,
    trace: crate::trace::CallTrace,
    outcome: &'static str,
    failure: &'static str,
    took: std::time::Duration,
}

impl Closing {
    /// The lines of the call of `spec` with `trace`, whose reply says
    /// `diagnostics`, `took` after it started.
    pub(crate) fn new(
        spec: crate::tools::ToolSpec,
        trace: crate::trace::CallTrace,
        diagnostics: &snowluma_proto::Diagnostics,
        took: std::time::Duration,
    ) -> Closing {
        let (outcome, failure) = outcome_failure(diagnostics);
        Closing { tool: spec.name, trace, outcome, failure, took }
    }

    /// The trace diagnostic, if any, at once; the closing line held.
    pub(crate) fn hold(self) {
        diagnose(self.tool, &self.trace);
        hold(|| self.line());
    }

    /// Both at once (a call that gets no answer), after the held lines.
    pub(crate) fn write_now(self) {
        diagnose(self.tool, &self.trace);
        write_now(|| self.line());
    }

    fn line(self) -> Line {
        let Closing { tool, trace, outcome, failure, took } = self;
        Line::of(tool, trace.traceparent, (outcome, failure), took)
    }
}

impl Line {
    /// The closing line of a call of `tool` whose reply says
    /// `(outcome, failure)` ([`outcome_failure`]), `took` after it started.
    fn of(
        tool: &'static str,
        traceparent: String,
        (outcome, failure): (&'static str, &'static str),
        took: std::time::Duration,
    ) -> Line {
        Line { tool, traceparent, outcome, failure, duration_ms: took.as_secs_f64() * 1000.0 }
    }
}

/// The outcome and the failure's kind (`none`) a closing line names.
fn outcome_failure(d: &snowluma_proto::Diagnostics) -> (&'static str, &'static str) {
    (d.outcome.as_str(), d.kind.map(|k| k.as_str()).unwrap_or("none"))
}

/// A call's trace diagnostic (an invalid traceparent or tracestate it
/// ignored), if it has one.
fn diagnose(tool: &'static str, trace: &crate::trace::CallTrace) {
    if let Some(d) = trace.diagnostic() {
        tracing::info!(target: "snowluma_mcp::server", tool, traceparent = %trace.traceparent, "{d}");
    }
}

/// Whether the closing lines are written: info lines of the target they
/// always had are on.
fn enabled() -> bool {
    tracing::enabled!(target: "snowluma_mcp::server", tracing::Level::INFO)
}

/// Hold the line of a call just finished (only when info lines are on:
/// otherwise there is nothing to write); the first one held wakes the
/// flusher.
pub(crate) fn hold(line: impl FnOnce() -> Line) {
    if enabled() && HELD.hold(line()) == 1 {
        FLUSH.notify_one();
    }
}

/// Write the held lines [`HOLD_FOR`] after the first of them: a task of
/// the session's, for its whole life.
pub(crate) async fn flusher() {
    loop {
        FLUSH.notified().await;
        tokio::time::sleep(HOLD_FOR).await;
        write_held();
    }
}

/// Write the line of a call that gets no answer (cancelled), after the
/// held ones.
pub(crate) fn write_now(line: impl FnOnce() -> Line) {
    if enabled() {
        HELD.write_now(line());
    } else {
        HELD.write_all();
    }
}

/// Write the held lines now (the flusher's, and the session's last act).
pub(crate) fn write_held() {
    HELD.write_all();
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    thread_local! {
        static CAPTURED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }

    fn capture(line: &[u8]) {
        CAPTURED.with(|c| c.borrow_mut().extend_from_slice(line));
    }

    fn text() -> String {
        CAPTURED.with(|c| String::from_utf8(c.borrow().clone()).unwrap())
    }

    /// Run `f` on a new store whose lines go to this thread's buffer.
    fn captured(f: impl FnOnce(&Held)) {
        CAPTURED.with(|c| c.borrow_mut().clear());
        f(&Held { lines: Mutex::new(Vec::new()), sink: capture });
    }

    fn line(n: usize) -> Line {
        Line {
            tool: "query_action",
            traceparent: format!("tp-{n}"),
            outcome: "success",
            failure: "none",
            duration_ms: 0.5,
        }
    }

    /// A held line is written only when told, whole, in order; a full
    /// batch of [`MAX_HELD`] is written at once.
    #[test]
    fn held_lines_are_written_after_the_answer_in_order_and_never_lost() {
        captured(|held| {
            held.hold(line(1));
            held.hold(line(2));
            assert_eq!(text(), "", "nothing is written before the answer");
            held.write_all();
            let text1 = text();
            let first = text1.find("traceparent=tp-1").expect("first line");
            let second = text1.find("traceparent=tp-2").expect("second line");
            assert!(first < second, "{text1}");
            assert!(text1.contains("Z  INFO tool call tool=\"query_action\""), "{text1}");
            assert!(text1.contains("outcome=\"success\" failure=\"none\" duration_ms=0.5\n"), "{text1}");
            assert_eq!(text1.lines().count(), 2);
            held.write_all();
            assert_eq!(text().lines().count(), 2, "a line is written once");

            for n in 1..MAX_HELD {
                assert_eq!(held.hold(line(100 + n)), n, "held, and counted");
            }
            assert_eq!(text().lines().count(), 2, "{} lines wait", MAX_HELD - 1);
            assert_eq!(held.hold(line(999)), 0, "the last of a full batch writes them all");
            let all = text();
            assert_eq!(all.lines().count(), 2 + MAX_HELD, "{all}");
            assert!(all.find("tp-115").unwrap() < all.find("tp-999").unwrap(), "oldest first");
        });
    }

    /// The line of a call that gets no answer (cancelled) is written at
    /// once, after the lines already held.
    #[test]
    fn a_cancelled_call_s_line_is_written_at_once_after_the_held_ones() {
        captured(|held| {
            held.hold(line(1));
            held.write_all();
            held.hold(line(2));
            held.write_all();
            held.hold(line(3));
            let before = text().lines().count();
            held.write_now(Line { failure: "cancelled", ..line(4) });
            let all = text();
            assert_eq!((before, all.lines().count()), (2, 4), "{all}");
            assert!(all.find("tp-3").unwrap() < all.find("tp-4").unwrap(), "{all}");
            assert!(all.contains("traceparent=tp-4 outcome=\"success\" failure=\"cancelled\""), "{all}");
        });
    }

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The line is the one tracing's formatter wrote for it (as the
    /// processes set it up: no colours, no target), field for field; only
    /// the time is written here, in its timer's form.
    #[test]
    fn the_line_is_the_one_tracing_wrote() {
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_target(false)
            .without_time()
            .with_writer(move || writer.clone())
            .finish();
        let lines = [
            line(1),
            Line { duration_ms: 1234.000001, ..line(2) },
            Line { duration_ms: 1e-7, outcome: "unknown", failure: "worker_unavailable", ..line(3) },
            Line { tool: "invoke_action_with_input", duration_ms: 0.0, ..line(4) },
            Line { tool: "odd \"tool\"", failure: "é", duration_ms: 12.5, ..line(5) },
        ];
        tracing::subscriber::with_default(subscriber, || {
            for l in &lines {
                tracing::info!(
                    target: "snowluma_mcp::server",
                    tool = l.tool,
                    traceparent = %l.traceparent,
                    outcome = l.outcome,
                    failure = l.failure,
                    duration_ms = l.duration_ms,
                    "tool call"
                );
            }
        });
        let theirs = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let mut ours = Vec::new();
        for l in &lines {
            let mut one = Vec::new();
            l.render(SystemTime::UNIX_EPOCH, &mut one);
            let one = String::from_utf8(one).unwrap();
            // Without its time, the line starts with its level, as theirs.
            ours.push(one.strip_prefix("1970-01-01T00:00:00.000000Z ").unwrap().to_owned());
        }
        assert_eq!(ours.concat(), theirs);
    }

    /// Times are written as tracing's timer writes them.
    #[test]
    fn times_are_rfc3339_utc_with_microseconds() {
        let at = |secs: u64, micros: u64| {
            let mut out = Vec::new();
            timestamp(SystemTime::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros), &mut out);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400, 1), "2000-02-29T00:00:00.000001Z");
        assert_eq!(at(951_868_799, 999_999), "2000-02-29T23:59:59.999999Z");
        assert_eq!(at(1_764_936_308, 398_134), "2025-12-05T12:05:08.398134Z");
        assert_eq!(at(4_107_542_400, 0), "2100-03-01T00:00:00.000000Z");
        assert_eq!(at(253_402_300_799, 0), "9999-12-31T23:59:59.000000Z");
        // The same second again (its prefix kept), then the next one.
        assert_eq!(at(253_402_300_799, 12), "9999-12-31T23:59:59.000012Z");
        assert_eq!(at(1_764_936_308, 5), "2025-12-05T12:05:08.000005Z");
        assert_eq!(at(1_764_936_309, 5), "2025-12-05T12:05:09.000005Z");
        assert_eq!(at(253_402_300_800, 0), "+10000-01-01T00:00:00.000000Z");
    }
}
