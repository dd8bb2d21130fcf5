//! Logging: one logfmt line per event, formatted without colour codes or a
//! heap allocation per field, and written through a buffer, so that the
//! access log (one event per request) costs no system call per request.
//!
//! The buffer is written out when it reaches 64 KiB, every second, at once
//! after a warning or an error, and when `serve` stops (as nginx's
//! `access_log … buffer=64k flush=1s`). A crash can lose at most the last
//! second of access lines; warnings and errors are never held back.
//! `serve` puts tracing-appender's non-blocking writer (lossless) behind
//! the buffer, so writing out is a hand-off to that writer's thread, never
//! a write to stderr on a runtime worker; its guard, dropped when `serve`
//! ends, waits for every line to be written.
//!
//! Values an attacker can choose (a tool name from a request body) are
//! quoted and escaped, so no value can forge a line or a field: control
//! characters (C0, DEL and C1, U+0085 among them), the Unicode line and
//! paragraph separators U+2028 and U+2029 (line breaks to Unicode-aware
//! splitters and viewers) and the bidirectional controls (which reorder
//! what a person reads) are written as escapes in both formats
//! ([`needs_escape`]).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// Bytes held before the buffer is written out regardless of the timer.
const FLUSH_AT: usize = 64 * 1024;
/// How long an access line may wait in the buffer.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// The event format: `<RFC 3339 UTC time> <LEVEL> <target> key=value …`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Logfmt;

/// The same events as one JSON object per line (`--log-format json`):
/// `{"time":…,"level":…,"target":…,"msg":…,<fields>}`.
#[derive(Debug, Default, Clone, Copy)]
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        format_json_line(&mut w, SystemTime::now(), event)
    }
}

fn format_json_line(
    w: &mut dyn std::fmt::Write,
    now: SystemTime,
    event: &Event<'_>,
) -> std::fmt::Result {
    let meta = event.metadata();
    w.write_str("{\"time\":\"")?;
    write_time(w, now)?;
    w.write_str("\",\"level\":\"")?;
    w.write_str(level_str(meta.level()))?;
    w.write_str("\",\"target\":")?;
    write_json_str(w, meta.target())?;
    let mut fields = Fields {
        w,
        result: Ok(()),
        json: true,
    };
    event.record(&mut fields);
    fields.result?;
    w.write_str("}\n")
}

/// A character a log value never holds raw: a control character (C0,
/// DEL, C1 with U+0085 NEL), a line or paragraph separator (U+2028,
/// U+2029), or a bidirectional control (U+061C, U+200E, U+200F,
/// U+202A–U+202E, U+2066–U+2069).
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{061c}' | '\u{200e}' | '\u{200f}'
        )
        || ('\u{202a}'..='\u{202e}').contains(&c)
        || ('\u{2066}'..='\u{2069}').contains(&c)
}

/// `s` as a terminal may show it: what [`needs_escape`] picks escaped
/// (`\u{1b}`, `\n`, `\u{2028}`), so a value an agent chose (a tool
/// name) cannot move the cursor, colour a table or start a line of its
/// own in a listing. Borrowed when nothing needs escaping.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if needs_escape(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A JSON string: quoted, with `"`, `\` and what [`needs_escape`] picks
/// escaped (`\u2028`: JSON allows it raw, but a JavaScript or
/// Unicode-aware reader breaks the line there).
fn write_json_str(w: &mut dyn std::fmt::Write, v: &str) -> std::fmt::Result {
    w.write_char('"')?;
    for c in v.chars() {
        match c {
            '"' => w.write_str("\\\"")?,
            '\\' => w.write_str("\\\\")?,
            '\n' => w.write_str("\\n")?,
            '\r' => w.write_str("\\r")?,
            '\t' => w.write_str("\\t")?,
            // All of these are in the Basic Multilingual Plane.
            c if needs_escape(c) => write!(w, "\\u{:04x}", c as u32)?,
            c => w.write_char(c)?,
        }
    }
    w.write_char('"')
}

impl<S, N> FormatEvent<S, N> for Logfmt
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        format_line(&mut w, SystemTime::now(), event)
    }
}

fn format_line(
    w: &mut dyn std::fmt::Write,
    now: SystemTime,
    event: &Event<'_>,
) -> std::fmt::Result {
    let meta = event.metadata();
    write_time(w, now)?;
    w.write_char(' ')?;
    w.write_str(level_str(meta.level()))?;
    w.write_char(' ')?;
    w.write_str(meta.target())?;
    let mut fields = Fields {
        w,
        result: Ok(()),
        json: false,
    };
    event.record(&mut fields);
    fields.result?;
    w.write_char('\n')
}

fn level_str(l: &Level) -> &'static str {
    match *l {
        Level::ERROR => "ERROR",
        Level::WARN => "WARN",
        Level::INFO => "INFO",
        Level::DEBUG => "DEBUG",
        Level::TRACE => "TRACE",
    }
}

/// `2026-12-03T07:28:04.151950Z`, from the Unix time (civil-from-days).
/// `t` as RFC 3339 in UTC with microseconds (`2026-12-03T07:43:26.775305Z`).
pub fn rfc3339(t: SystemTime) -> String {
    let mut s = String::with_capacity(27);
    let _ = write_time(&mut s, t);
    s
}

fn write_time(w: &mut dyn std::fmt::Write, t: SystemTime) -> std::fmt::Result {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    // Digits into a fixed buffer: `write!` with widths cost 2,200
    // instructions per access line (callgrind), a tenth of the request.
    let mut b = *b"0000-00-00T00:00:00.000000Z";
    let mut put = |at: usize, width: usize, mut v: u64| {
        for i in (at..at + width).rev() {
            b[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, month);
    put(8, 2, day);
    put(11, 2, rem / 3_600);
    put(14, 2, rem / 60 % 60);
    put(17, 2, rem % 60);
    put(20, 6, u64::from(d.subsec_micros()));
    // Only ASCII digits and separators were written.
    w.write_str(std::str::from_utf8(&b).map_err(|_| std::fmt::Error)?)
}

/// Writes ` key=value` (or `,"key":value` in JSON) for each field; the
/// `message` field as `msg`.
struct Fields<'a> {
    w: &'a mut dyn std::fmt::Write,
    result: std::fmt::Result,
    json: bool,
}

impl Fields<'_> {
    fn key(&mut self, f: &Field) -> std::fmt::Result {
        let name = if f.name() == "message" {
            "msg"
        } else {
            f.name()
        };
        if self.json {
            self.w.write_char(',')?;
            write_json_str(self.w, name)?;
            return self.w.write_char(':');
        }
        self.w.write_char(' ')?;
        self.w.write_str(name)?;
        self.w.write_char('=')
    }

    fn text(&mut self, f: &Field, v: &str) {
        let json = self.json;
        self.put(f, |w| {
            if json {
                write_json_str(w, v)
            } else {
                write_value(w, v)
            }
        });
    }

    fn put(&mut self, f: &Field, write: impl FnOnce(&mut dyn std::fmt::Write) -> std::fmt::Result) {
        if self.result.is_ok() {
            self.result = self.key(f).and_then(|()| write(self.w));
        }
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, f: &Field, v: &str) {
        self.text(f, v);
    }
    fn record_u64(&mut self, f: &Field, v: u64) {
        self.put(f, |w| w.write_str(itoa::Buffer::new().format(v)));
    }
    fn record_i64(&mut self, f: &Field, v: i64) {
        self.put(f, |w| w.write_str(itoa::Buffer::new().format(v)));
    }
    fn record_bool(&mut self, f: &Field, v: bool) {
        self.put(f, |w| w.write_str(if v { "true" } else { "false" }));
    }
    fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
        // Not on the request path: errors and start-up messages.
        let s = format!("{v:?}");
        self.text(f, &s);
    }
}

/// The bytes a value may be written bare with: a table, as every field of
/// every access line is checked byte by byte (a 32-digit request id took
/// ~300 instructions through a `matches!` range chain).
const BARE: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric()
            || matches!(c, b'-' | b'_' | b'.' | b'/' | b':' | b'@' | b'+' | b',');
        b += 1;
    }
    t
};

/// A value bare when it is plainly safe, else quoted with `"`, `\` and
/// what [`needs_escape`] picks escaped (`\n`, `\u{2028}`).
fn write_value(w: &mut dyn std::fmt::Write, v: &str) -> std::fmt::Result {
    let bare = !v.is_empty() && v.bytes().all(|b| BARE[usize::from(b)]);
    if bare {
        return w.write_str(v);
    }
    w.write_char('"')?;
    for c in v.chars() {
        match c {
            '"' => w.write_str("\\\"")?,
            '\\' => w.write_str("\\\\")?,
            c if needs_escape(c) => write!(w, "{}", c.escape_default())?,
            c => w.write_char(c)?,
        }
    }
    w.write_char('"')
}

/// A `MakeWriter` that buffers lines and writes them to `sink` in batches.
/// Cloning shares the buffer.
#[derive(Clone)]
pub struct Buffered {
    inner: Arc<Inner>,
}

struct Inner {
    buf: Mutex<Vec<u8>>,
    /// Held while writing to the sink, so batches keep their order.
    sink: Mutex<Box<dyn Write + Send>>,
}

impl Inner {
    fn flush(&self) {
        let mut sink = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        let batch = {
            let mut buf = self.buf.lock().unwrap_or_else(|p| p.into_inner());
            if buf.is_empty() {
                return;
            }
            std::mem::replace(&mut *buf, Vec::with_capacity(FLUSH_AT))
        };
        // A log that cannot be written has nowhere to report it.
        let _ = sink.write_all(&batch).and_then(|()| sink.flush());
    }
}

impl Buffered {
    /// A buffer in front of `sink`, flushed only when full, on warnings and
    /// errors, and by [`Buffered::flush`].
    pub fn new(sink: Box<dyn Write + Send>) -> Self {
        Buffered {
            inner: Arc::new(Inner {
                buf: Mutex::new(Vec::with_capacity(FLUSH_AT)),
                sink: Mutex::new(sink),
            }),
        }
    }

    /// A buffer in front of stderr with a thread that flushes it every
    /// [`FLUSH_EVERY`].
    pub fn stderr() -> Self {
        Self::with_flush_thread(Box::new(std::io::stderr()))
    }

    /// A buffer in front of `sink` with a thread that flushes it every
    /// [`FLUSH_EVERY`].
    pub fn with_flush_thread(sink: Box<dyn Write + Send>) -> Self {
        let b = Self::new(sink);
        let inner = Arc::downgrade(&b.inner);
        let spawned = std::thread::Builder::new()
            .name("tessera-log-flush".into())
            .spawn(move || loop {
                std::thread::sleep(FLUSH_EVERY);
                match inner.upgrade() {
                    Some(i) => i.flush(),
                    None => return,
                }
            });
        if let Err(e) = spawned {
            eprintln!("tessera: no log flush thread ({e}); lines are written per 64 KiB");
        }
        b
    }

    /// Write out everything buffered.
    pub fn flush(&self) {
        self.inner.flush();
    }
}

/// One event's writer: appends to the buffer; a warning or error, or a
/// full buffer, writes the buffer out when the event is complete.
pub struct Line<'a> {
    inner: &'a Inner,
    urgent: bool,
}

impl Write for Line<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let mut buf = self.inner.buf.lock().unwrap_or_else(|p| p.into_inner());
        buf.extend_from_slice(b);
        self.urgent |= buf.len() >= FLUSH_AT;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        if self.urgent {
            self.inner.flush();
        }
    }
}

impl<'a> MakeWriter<'a> for Buffered {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Line<'a> {
        Line {
            inner: &self.inner,
            urgent: false,
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Line<'a> {
        Line {
            inner: &self.inner,
            // ERROR and WARN sort below INFO in tracing's order.
            urgent: *meta.level() <= Level::WARN,
        }
    }
}

/// Why a filter was refused (`PUT /v1/log-level`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LogLevelError {
    #[error("give a level (error, warn, info, debug, trace) or EnvFilter directives (info,tessera::access=warn)")]
    Empty,
    #[error("the filter is longer than {MAX_FILTER_BYTES} bytes")]
    TooLong,
    #[error("{0}: give a level (error, warn, info, debug, trace) or EnvFilter directives (info,tessera::access=warn)")]
    Invalid(String),
    #[error("this process's log filter cannot be changed while it runs")]
    Unavailable,
}

/// The longest filter text taken.
const MAX_FILTER_BYTES: usize = 1024;

/// A log filter: a level (`debug`) or `EnvFilter` directives
/// (`info,tessera::access=warn`), checked.
pub struct Filter {
    text: String,
    filter: EnvFilter,
}

impl Filter {
    /// Parse `text`; an empty or invalid filter is refused with a message
    /// that says what to give.
    pub fn parse(text: &str) -> Result<Filter, LogLevelError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(LogLevelError::Empty);
        }
        if text.len() > MAX_FILTER_BYTES {
            return Err(LogLevelError::TooLong);
        }
        // A bare word that is not a level is, to EnvFilter, a target
        // enabled at every level, and every other target is then off: a
        // misspelt `warning` would silence the log, errors included.
        // Targets take a level here (`tessera::proxy=debug`).
        if let Some(word) = text
            .split(',')
            .map(str::trim)
            .find(|d| !d.contains('=') && d.parse::<LevelFilter>().is_err())
        {
            return Err(LogLevelError::Invalid(format!(
                "{:?} is not a level (a target needs one: TARGET=LEVEL)",
                printable(word)
            )));
        }
        let filter = EnvFilter::builder()
            .parse(text)
            .map_err(|e| LogLevelError::Invalid(format!("{:?}: {e}", printable(text))))?;
        Ok(Filter {
            text: text.to_string(),
            filter,
        })
    }

    /// The filter as given (trimmed).
    pub fn text(&self) -> &str {
        &self.text
    }
}

/// The process's log filter, changeable while it runs
/// (`tracing_subscriber::reload`): `tessera log-level` through
/// `PUT /v1/log-level`.
pub struct LogFilter {
    handle: reload::Handle<EnvFilter, Registry>,
    current: Mutex<String>,
}

impl LogFilter {
    /// The filter in force, as last set.
    pub fn current(&self) -> String {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Put `f` in force from the next event on.
    pub fn set(&self, f: Filter) -> Result<(), LogLevelError> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        self.handle
            .reload(f.filter)
            .map_err(|_| LogLevelError::Unavailable)?;
        *current = f.text;
        Ok(())
    }
}

/// The lines' format (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Logfmt,
    Json,
}

/// Install the process's subscriber: `initial` filters (a reloadable
/// `EnvFilter`), lines in `format` to `writer`. The returned [`LogFilter`]
/// changes the filter while the process runs.
pub fn init<W>(initial: Filter, format: Format, writer: W) -> LogFilter
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let (layer, handle) = reload::Layer::new(initial.filter);
    let fmt = tracing_subscriber::fmt::layer().with_writer(writer);
    let registry = tracing_subscriber::registry().with(layer);
    match format {
        Format::Json => registry.with(fmt.event_format(JsonLines)).init(),
        Format::Logfmt => registry.with(fmt.event_format(Logfmt)).init(),
    }
    LogFilter {
        handle,
        current: Mutex::new(initial.text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink the test can read.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl Shared {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn with_logger(f: impl FnOnce()) -> (Buffered, Shared) {
        let sink = Shared::default();
        let buffered = Buffered::new(Box::new(sink.clone()));
        let sub = tracing_subscriber::fmt()
            .event_format(Logfmt)
            .with_writer(buffered.clone())
            .with_max_level(Level::INFO)
            .finish();
        tracing::subscriber::with_default(sub, f);
        (buffered, sink)
    }

    #[test]
    fn time_is_rfc3339_utc() {
        let mut s = String::new();
        write_time(&mut s, UNIX_EPOCH).unwrap();
        assert_eq!(s, "1970-01-01T00:00:00.000000Z");
        let mut s = String::new();
        let t = UNIX_EPOCH + Duration::new(1_796_282_885, 377_406_935);
        write_time(&mut s, t).unwrap();
        assert_eq!(s, "2026-12-03T07:28:05.377406Z");
        let mut s = String::new();
        write_time(&mut s, UNIX_EPOCH + Duration::from_secs(951_782_400)).unwrap();
        assert_eq!(s, "2000-02-29T00:00:00.000000Z");
    }

    #[test]
    fn fields_are_logfmt_and_hostile_values_are_escaped() {
        let (buffered, sink) = with_logger(|| {
            tracing::info!(
                target: "tessera::access",
                caller = "agent-1",
                tool = "evil\nINFO tessera::access forged=1 \"q\"",
                connection = None::<&str>,
                status = 200u16,
                ok = true,
                "done"
            );
        });
        buffered.flush();
        let text = sink.text();
        let line = text.strip_suffix('\n').unwrap();
        assert!(!line.contains('\n'), "{line}");
        let (_, rest) = line.split_once(' ').unwrap();
        assert_eq!(
            rest,
            r#"INFO tessera::access msg=done caller=agent-1 tool="evil\nINFO tessera::access forged=1 \"q\"" status=200 ok=true"#
        );
    }

    #[test]
    fn json_lines_are_one_object_each_and_hostile_values_stay_inside() {
        let sink = Shared::default();
        let buffered = Buffered::new(Box::new(sink.clone()));
        let sub = tracing_subscriber::fmt()
            .event_format(JsonLines)
            .with_writer(buffered.clone())
            .finish();
        tracing::subscriber::with_default(sub, || {
            tracing::info!(
                target: "tessera::access",
                caller = "agent-1",
                tool = "evil\"}\n{\"forged\":1\u{1}",
                status = 200u16,
                ok = true,
                "done"
            );
        });
        buffered.flush();
        let text = sink.text();
        assert_eq!(text.lines().count(), 1, "{text}");
        let v: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["target"], "tessera::access");
        assert_eq!(v["msg"], "done");
        assert_eq!(v["caller"], "agent-1");
        assert_eq!(v["tool"], "evil\"}\n{\"forged\":1\u{1}");
        assert_eq!(v["status"], 200);
        assert_eq!(v["ok"], true);
        assert!(v.get("forged").is_none());
        assert!(v["time"].as_str().unwrap().ends_with('Z'));
    }

    #[test]
    fn printable_escapes_what_a_terminal_would_act_on() {
        assert!(matches!(
            printable("write_file"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            printable("w\u{1b}[31mEVIL\nfake\u{2028}\u{202e}x"),
            "w\\u{1b}[31mEVIL\\nfake\\u{2028}\\u{202e}x"
        );
    }

    #[test]
    fn line_separators_and_bidi_controls_are_escaped_in_both_formats() {
        let hostile = "a\u{2028}INFO forged=1\u{2029}b\u{85}c\u{202e}d\u{9b}e";
        let (buffered, sink) = with_logger(|| tracing::info!(tool = hostile));
        buffered.flush();
        let text = sink.text();
        assert!(
            text.trim_end()
                .ends_with(r#"tool="a\u{2028}INFO forged=1\u{2029}b\u{85}c\u{202e}d\u{9b}e""#),
            "{text}"
        );
        let mut json = String::new();
        let sink = Shared::default();
        let buffered = Buffered::new(Box::new(sink.clone()));
        let sub = tracing_subscriber::fmt()
            .event_format(JsonLines)
            .with_writer(buffered.clone())
            .finish();
        tracing::subscriber::with_default(sub, || tracing::info!(tool = hostile));
        buffered.flush();
        json.push_str(&sink.text());
        assert!(
            json.contains(r#""tool":"a\u2028INFO forged=1\u2029b\u0085c\u202ed\u009be""#),
            "{json}"
        );
        let v: serde_json::Value = serde_json::from_str(json.trim_end()).unwrap();
        assert_eq!(v["tool"], hostile);
        for out in [&text, &json] {
            assert!(!out.contains(['\u{2028}', '\u{2029}', '\u{85}', '\u{202e}', '\u{9b}']));
        }
    }

    #[test]
    fn info_waits_for_the_flush_and_warnings_do_not() {
        let (buffered, sink) = with_logger(|| tracing::info!(status = 200u16));
        assert_eq!(sink.text(), "", "an info line must wait in the buffer");
        buffered.flush();
        assert!(sink.text().ends_with("status=200\n"));
        let (_, sink) = with_logger(|| {
            tracing::info!(a = 1u64);
            tracing::warn!(b = 2u64);
        });
        let text = sink.text();
        assert!(text.contains("INFO") && text.contains("WARN"), "{text}");
    }

    #[test]
    fn filters_are_checked_before_they_are_used() {
        assert_eq!(Filter::parse("debug").unwrap().text(), "debug");
        assert_eq!(
            Filter::parse(" info,tessera::access=warn ").unwrap().text(),
            "info,tessera::access=warn"
        );
        assert_eq!(Filter::parse("  ").err(), Some(LogLevelError::Empty));
        // A bare word that is no level would turn every other target off
        // (EnvFilter reads it as a target): refused, alone or in a list.
        for word in ["warning", "bogus", "info,verbose", "tessera::proxy"] {
            let e = Filter::parse(word).err().expect(word).to_string();
            assert!(e.contains("is not a level"), "{word}: {e}");
        }
        for ok in ["off", "WARN", "error,tessera::proxy=debug"] {
            assert!(Filter::parse(ok).is_ok(), "{ok}");
        }
        let bad = Filter::parse("tessera=loud").err().unwrap().to_string();
        assert!(
            bad.contains("tessera=loud") && bad.contains("give a level"),
            "{bad}"
        );
        let long = "a".repeat(MAX_FILTER_BYTES + 1);
        assert_eq!(Filter::parse(&long).err(), Some(LogLevelError::TooLong));
    }

    /// `serve`'s writer: a warning is handed to tracing-appender's thread
    /// (lossless) rather than written by the thread that logs it, which
    /// goes on while the sink is stuck; every line is written by the time
    /// the guard is dropped.
    #[test]
    fn a_warning_is_written_by_the_writer_thread_not_the_caller() {
        struct Stuck(std::sync::mpsc::Receiver<()>, Shared);
        impl Write for Stuck {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                // Until the test lets go (drops the sender).
                let _ = self.0.recv();
                self.1.write(b)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (release, stuck) = std::sync::mpsc::channel();
        let sink = Shared::default();
        let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
            .lossy(false)
            .finish(Stuck(stuck, sink.clone()));
        let buffered = Buffered::new(Box::new(writer));
        let sub = tracing_subscriber::fmt()
            .event_format(Logfmt)
            .with_writer(buffered.clone())
            .finish();
        tracing::subscriber::with_default(sub, || {
            tracing::info!(a = 1u64);
            tracing::warn!(b = 2u64);
        });
        assert_eq!(sink.text(), "", "the logging thread wrote to the sink");
        drop(release);
        buffered.flush();
        drop(guard);
        let text = sink.text();
        assert!(
            text.contains("INFO") && text.contains("WARN") && text.ends_with(" b=2\n"),
            "{text}"
        );
    }

    #[test]
    fn a_full_buffer_is_written_out() {
        let (_, sink) = with_logger(|| {
            for _ in 0..(FLUSH_AT / 40 + 1) {
                tracing::info!(v = "0123456789012345678901234567890123456789");
            }
        });
        assert!(sink.text().len() >= FLUSH_AT);
    }
}
