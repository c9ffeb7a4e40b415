//! The closing diagnostic line of each tool call (`tool call`, with its
//! outcome and duration), held until the call's answer is on stdout.
//!
//! Formatting that line and writing it to stderr (a system call) came
//! between the network executor's answer and the client's: a few
//! microseconds of every call's latency. Held, it is written once the
//! transport has written the answer, while the client reads it. Nothing is
//! lost or reordered: held lines are written, in the order their calls
//! finished, after each message the transport writes (a finished call's
//! answer follows its line: nothing awaits between the two), before each
//! input message is handled, and at the session's end. A call the client
//! cancelled gets no answer (rmcp drops it), so its line is written at
//! once ([`write_now`]); one cancelled just after it finished is written
//! with the next message either way. At most [`MAX_HELD`] wait; a line
//! beyond them, or one that finds the store unusable, is written at once.
//! The held lines are written together: with calls in flight, one stderr
//! write carries the lines of every answer of one stdout write.

use std::sync::Mutex;

/// Most lines held at once.
pub(crate) const MAX_HELD: usize = 64;

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
    fn write(&self) {
        // The target the line always had (it was written from the server).
        tracing::info!(
            target: "snowluma_mcp::server",
            tool = self.tool,
            traceparent = %self.traceparent,
            outcome = self.outcome,
            failure = self.failure,
            duration_ms = self.duration_ms,
            "tool call"
        );
    }
}

/// Lines waiting for their call's answer to be written.
pub(crate) struct Held(Mutex<Vec<Line>>);

/// The process's store (a session is one process).
static HELD: Held = Held::new();

impl Held {
    pub(crate) const fn new() -> Held {
        Held(Mutex::new(Vec::new()))
    }

    /// Keep `line` until [`Held::write_all`]; write it now when
    /// [`MAX_HELD`] already wait.
    pub(crate) fn hold(&self, line: Line) {
        let line = match self.0.lock() {
            Ok(mut held) if held.len() < MAX_HELD => {
                held.push(line);
                return;
            }
            _ => line,
        };
        self.write_now(line);
    }

    /// Write the line of a call that gets no answer, after the held ones.
    pub(crate) fn write_now(&self, line: Line) {
        self.write_all();
        line.write();
    }

    /// Write every held line, oldest first, together (the lines of calls
    /// answered in one stdout write go out in one stderr write).
    pub(crate) fn write_all(&self) {
        if let Ok(mut held) = self.0.lock() {
            if held.is_empty() {
                return;
            }
            // Written under the lock so that two writers keep the order;
            // a diagnostic write never waits (`snowluma_logsink`).
            snowluma_logsink::together(|| {
                for line in held.drain(..) {
                    line.write();
                }
            });
        }
    }
}

/// A tool call has finished: its log lines, never arguments, contents,
/// tokens or paths. Its trace diagnostic, if any, at once; its closing line
/// held for its answer, or written at once when `ct` was cancelled (it gets
/// no answer). Both with the target they always had.
pub(crate) fn finished(
    spec: crate::tools::ToolSpec,
    trace: &crate::trace::CallTrace,
    reply: &snowluma_proto::ToolReply,
    started: std::time::Instant,
    ct: &tokio_util::sync::CancellationToken,
) {
    if let Some(d) = trace.diagnostic() {
        tracing::info!(target: "snowluma_mcp::server", tool = spec.name, traceparent = %trace.traceparent, "{d}");
    }
    let line = || Line {
        tool: spec.name,
        traceparent: trace.traceparent.clone(),
        outcome: reply.diagnostics.outcome.as_str(),
        failure: reply.diagnostics.kind.map(|k| k.as_str()).unwrap_or("none"),
        duration_ms: started.elapsed().as_secs_f64() * 1000.0,
    };
    if ct.is_cancelled() {
        write_now(line);
    } else {
        hold(line);
    }
}

/// Hold the line of a call just finished (only when info lines are on:
/// otherwise there is nothing to write).
pub(crate) fn hold(line: impl FnOnce() -> Line) {
    if tracing::enabled!(target: "snowluma_mcp::server", tracing::Level::INFO) {
        HELD.hold(line());
    }
}

/// Write the line of a call that gets no answer (cancelled), after the
/// held ones.
pub(crate) fn write_now(line: impl FnOnce() -> Line) {
    HELD.write_now(line());
}

/// Write the held lines: after each message written to stdout, before each
/// input message is handled, and at the session's end.
pub(crate) fn write_held() {
    HELD.write_all();
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

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

    impl Buf {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// Run `f` on a new store, with every diagnostic line written to the
    /// buffer it is given.
    fn captured(f: impl FnOnce(&Held, &Buf)) {
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(move || writer.clone()).finish();
        tracing::subscriber::with_default(subscriber, || f(&Held::new(), &buf));
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

    /// A held line is written only when told, whole, in order, with the
    /// target it always had; past [`MAX_HELD`] lines are written at once.
    #[test]
    fn held_lines_are_written_after_the_answer_in_order_and_never_lost() {
        captured(|held, buf| {
            held.hold(line(1));
            held.hold(line(2));
            assert_eq!(buf.text(), "", "nothing is written before the answer");
            held.write_all();
            let text = buf.text();
            let first = text.find("traceparent=tp-1").expect("first line");
            let second = text.find("traceparent=tp-2").expect("second line");
            assert!(first < second, "{text}");
            assert!(text.contains("INFO snowluma_mcp::server: tool call tool=\"query_action\""), "{text}");
            assert!(text.contains("outcome=\"success\" failure=\"none\" duration_ms=0.5"), "{text}");
            assert_eq!(text.lines().count(), 2);
            held.write_all();
            assert_eq!(buf.text().lines().count(), 2, "a line is written once");

            for n in 0..MAX_HELD {
                held.hold(line(100 + n));
            }
            assert_eq!(buf.text().lines().count(), 2, "{MAX_HELD} lines wait");
            held.hold(line(999));
            let text = buf.text();
            assert_eq!(text.lines().count(), 2 + MAX_HELD + 1, "one more writes them all");
            assert!(text.find("tp-163").unwrap() < text.find("tp-999").unwrap(), "oldest first");
        });
    }

    /// The line of a call that gets no answer (cancelled) is written at
    /// once, after the lines already held.
    #[test]
    fn a_cancelled_call_s_line_is_written_at_once_after_the_held_ones() {
        captured(|held, buf| {
            held.hold(line(1));
            held.write_all();
            held.hold(line(2));
            held.write_all();
            held.hold(line(3));
            let before = buf.text().lines().count();
            held.write_now(Line { failure: "cancelled", ..line(4) });
            let text = buf.text();
            assert_eq!((before, text.lines().count()), (2, 4), "{text}");
            assert!(text.find("tp-3").unwrap() < text.find("tp-4").unwrap(), "{text}");
            assert!(text.contains("traceparent=tp-4 outcome=\"success\" failure=\"cancelled\""), "{text}");
        });
    }
}
