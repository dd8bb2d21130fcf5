//! The scan of one stream of text (a body, or the joined header fields):
//! the raw bytes and [`LEVELS`] levels of escape decoding above them, each
//! walked by the matcher, and the raw ranges to redact that they find.
//!
//! A level only does work while it differs from the one below: while its
//! text cannot hold a piece the lower level would miss, it is *synced* and
//! follows that level for free. It stays synced through an escape that
//! decodes to bytes no form holds (`\n`, `\"`, `\u00e9`, `%20`: no piece
//! can run through them), and works on its own only from an escape that
//! decodes to a byte some form holds until a byte no form holds (or a
//! window of plain units) ends what it alone could find. Plain text, and
//! most escaped text, costs the raw walk alone, and the raw walk is itself
//! skipped wherever a q-gram filter says no piece can end.
//!
//! The scan also says how far the stream is decided: bytes before
//! [`Scan::safe`] cannot be part of any later match, so the body may pass
//! them on; only bytes that could still be the start of a piece are held.

use std::collections::VecDeque;

use super::matcher::{normalised, Matcher, Walk};
use super::unescape::{introduces, Unescape, Unit};

/// Levels of escape decoding over the raw text: an escape of an escape of
/// an escape (`%255Cu0073` is three), and one more for a serializer's own
/// escapes under three (`%2F` written by a URL encoder, then escaped
/// three times by encoders that escape some characters and not others:
/// a `%2F` whose `%` was escaped is reached a level later than one whose
/// `%` was not, so the text of the third level mixes `/` and `%2F`, and
/// only a fourth reads it as the secret; found by the fuzz target).
pub(crate) const LEVELS: usize = 4;

/// Units a synced level passes up while an escape is pending before it
/// works on its own: a long run of `%` must not grow a snapshot.
const MAX_PASSED: usize = 64;

#[derive(Debug, Default)]
struct Level {
    walk: Walk,
    /// The walk before the last unit (what a level above starts from).
    prev: Walk,
    synced: bool,
    /// Units in a row that the decoder passed unchanged.
    plain_run: u32,
    /// Spans of the most recent units (while not synced).
    ring: VecDeque<(u64, u64)>,
    dec: Unescape,
    /// Scratch for what the decoder emits.
    out: Vec<(Unit, bool)>,
    /// While synced with an escape pending: where the level was before it.
    snap: Snap,
}

/// A synced level's walk and recent spans as they were before an escape
/// began, the first raw byte that must be held for them, and the units the
/// level has passed up since (each with whether it was its input as is).
/// Its buffers are kept from one escape to the next.
#[derive(Debug, Default)]
struct Snap {
    active: bool,
    walk: Walk,
    ring: VecDeque<(u64, u64)>,
    hold: u64,
    passed: Vec<(Unit, bool)>,
}

/// The scan of one stream.
#[derive(Debug)]
pub(crate) struct Scan {
    raw: Walk,
    raw_prev: Walk,
    /// Raw bytes seen.
    pos: u64,
    /// The escape levels, made at the first escape and dropped when every
    /// one follows the raw text again: a stream of plain text (an idle
    /// SSE stream) carries none of them.
    levels: Option<Box<[Level; LEVELS]>>,
    /// Raw ranges `[start, end)` found and not yet taken.
    ranges: Vec<(u64, u64)>,
    /// The longest run any secret's threshold asks for.
    cap: u32,
    /// The text ended: nothing more can be held.
    finished: bool,
    /// The last q raw bytes, normalised and packed, and how many of them
    /// are valid (since the last byte that is in no form).
    gram: u32,
    glen: u32,
    /// The raw walk was skipped since the last q-gram some form holds: it
    /// is the walk over the bytes since the last one in no form (q - 1 at
    /// most), to be redone when needed.
    stale: bool,
}

impl Scan {
    pub(crate) fn new(m: &Matcher) -> Scan {
        Scan {
            raw: Walk::default(),
            raw_prev: Walk::default(),
            pos: 0,
            levels: None,
            ranges: Vec::new(),
            cap: m.longest_threshold().max(1),
            finished: false,
            gram: 0,
            glen: 0,
            stale: false,
        }
    }

    /// Raw bytes seen so far.
    pub(crate) fn position(&self) -> u64 {
        self.pos
    }

    /// Whether every level follows the raw text and no escape is pending.
    fn quiet(&self) -> bool {
        self.levels
            .as_deref()
            .is_none_or(|ls| ls.iter().all(|l| l.synced && l.dec.idle()))
    }

    /// The escape levels, made if there are none.
    fn lv(&mut self) -> &mut [Level; LEVELS] {
        self.levels.get_or_insert_with(|| {
            let mut levels: Box<[Level; LEVELS]> = Box::default();
            for l in levels.iter_mut() {
                l.synced = true;
            }
            levels
        })
    }

    /// Scan `data`, the next raw bytes.
    pub(crate) fn push(&mut self, m: &Matcher, data: &[u8]) {
        let mut rest = data;
        while !rest.is_empty() {
            if self.quiet() {
                // The plain stretch up to the next escape: the raw walk alone.
                let plain = memchr::memchr3(b'\\', b'%', b'&', rest).unwrap_or(rest.len());
                self.plain(m, &rest[..plain]);
                rest = &rest[plain..];
                if rest.is_empty() {
                    break;
                }
            }
            self.rewalk(m, 0);
            let b = rest[0];
            rest = &rest[1..];
            self.push_byte(m, b);
        }
        self.rewalk(m, 0);
        if self.levels.is_some() && self.quiet() {
            self.levels = None;
        }
    }

    /// Raw bytes with no escape in them while every level follows the raw
    /// text. The walk is skipped wherever the q-gram ending at a byte is
    /// in no form: a piece is at least q long, so none can end there.
    fn plain(&mut self, m: &Matcher, data: &[u8]) {
        let q = m.q();
        let mask = if q >= 4 { u32::MAX } else { (1 << (8 * q)) - 1 };
        // Kept in locals: stored through `self` on every byte, they made
        // each byte wait on the last one's store.
        let (mut gram, mut glen, mut stale) = (self.gram, self.glen, self.stale);
        let start = self.pos;
        for (i, &b) in data.iter().enumerate() {
            if !m.in_forms(b) {
                (gram, glen, stale) = (0, 0, true);
                continue;
            }
            gram = ((gram << 8) | u32::from(normalised(b))) & mask;
            glen = (glen + 1).min(q);
            if glen < q || !m.gram(gram) {
                stale = true;
                continue;
            }
            (self.gram, self.glen, self.stale) = (gram, glen, stale);
            self.pos = start + i as u64 + 1;
            self.rewalk(m, 1);
            let r = m.step(&mut self.raw, b);
            if r > 0 {
                self.add(self.pos - u64::from(r), self.pos);
            }
            stale = false;
        }
        (self.gram, self.glen, self.stale) = (gram, glen, stale);
        self.pos = start + data.len() as u64;
    }

    /// If the raw walk is stale, redo it over the bytes since the last one
    /// in no form (q - 1 at most) that end `back` bytes before the last
    /// (0: at the last byte; 1: just before it). No longer run in a form
    /// can end there: the q-gram that ended there said so.
    fn rewalk(&mut self, m: &Matcher, back: u32) {
        if !self.stale {
            return;
        }
        self.stale = false;
        self.raw = Walk::default();
        let n = self.glen.saturating_sub(back).min(m.q() - 1);
        for k in (back..back + n).rev() {
            m.step(&mut self.raw, (self.gram >> (8 * k)) as u8);
        }
    }

    fn push_byte(&mut self, m: &Matcher, b: u8) {
        let at = self.pos;
        self.pos += 1;
        self.raw_prev = self.raw;
        let r = m.step(&mut self.raw, b);
        if r > 0 {
            self.add(self.pos - u64::from(r), self.pos);
        }
        if m.in_forms(b) {
            let q = m.q();
            let mask = if q >= 4 { u32::MAX } else { (1 << (8 * q)) - 1 };
            self.gram = ((self.gram << 8) | u32::from(normalised(b))) & mask;
            self.glen = (self.glen + 1).min(q);
        } else {
            (self.gram, self.glen) = (0, 0);
        }
        self.feed(
            m,
            0,
            Unit {
                b,
                start: at,
                end: at + 1,
                dead: false,
            },
        );
    }

    /// Feed `u`, a unit of the level below, to level `i`'s decoder.
    fn feed(&mut self, m: &Matcher, i: usize, u: Unit) {
        if i == LEVELS {
            return;
        }
        let l = &self.lv()[i];
        if l.dec.idle() && (u.dead || !introduces(u.b)) {
            if l.synced {
                // Passed unchanged: this level is the one below.
                return self.feed(m, i + 1, u);
            }
            self.step(m, i, u, true);
            self.feed(m, i + 1, u);
            self.maybe_resync(i);
            return;
        }
        if l.dec.idle() && l.synced {
            // An escape may begin: remember where this level is.
            let mut ring = std::mem::take(&mut self.lv()[i].snap.ring);
            let walk = self.before(m, i as isize - 1, &mut ring);
            let hold = match walk.len().min(self.cap - 1) as usize {
                0 => u.start,
                h => ring[ring.len() - h].0,
            };
            let snap = &mut self.lv()[i].snap;
            snap.ring = ring;
            snap.walk = walk;
            snap.hold = hold;
            snap.passed.clear();
            snap.active = true;
        }
        let mut out = std::mem::take(&mut self.lv()[i].out);
        self.lv()[i].dec.push(u, &mut out);
        for (o, literal) in out.drain(..) {
            self.emit(m, i, o, literal);
        }
        self.lv()[i].out = out;
        // Only once the batch is through: a level that resynced halfway
        // would meet the rest of it without a snapshot.
        self.maybe_resync(i);
        let l = &mut self.lv()[i];
        if l.synced && l.dec.idle() {
            l.snap.active = false;
        }
    }

    /// Level `i`'s decoder emitted `o` (`literal`: its input as it was).
    fn emit(&mut self, m: &Matcher, i: usize, o: Unit, literal: bool) {
        if self.lv()[i].synced {
            let snap = &mut self.lv()[i].snap;
            debug_assert!(
                snap.active,
                "an escape pending on a synced level has a snapshot"
            );
            if (literal || !m.in_forms(o.b)) && snap.passed.len() < MAX_PASSED {
                // The level's text may differ from the lower one's here,
                // but not in a byte a piece could hold.
                snap.passed.push((o, literal));
                return self.feed(m, i + 1, o);
            }
            self.desync(m, i);
        }
        self.step(m, i, o, literal);
        self.feed(m, i + 1, o);
    }

    /// Where level `i` (-1: the raw text) was before its latest unit: its
    /// walk, and in `ring` the spans of the units that walk matched (`cap`
    /// at most).
    fn before(&self, m: &Matcher, i: isize, ring: &mut VecDeque<(u64, u64)>) -> Walk {
        ring.clear();
        if i < 0 {
            let n = u64::from(self.raw_prev.len().min(self.cap));
            let at = self.pos - 1;
            ring.extend((at - n..at).map(|s| (s, s + 1)));
            return self.raw_prev;
        }
        let l = &self
            .levels
            .as_deref()
            .expect("a level asks of the levels below")[i as usize];
        if !l.synced {
            let last = l.ring.len().saturating_sub(1);
            let keep = (l.prev.len().min(self.cap) as usize).min(last);
            ring.extend(l.ring.range(last - keep..last));
            return l.prev;
        }
        if l.snap.active && !l.snap.passed.is_empty() {
            // The unit is one this level passed up while an escape was
            // pending: its walk is the snapshot's over what it passed before.
            let mut walk = l.snap.walk;
            ring.extend(l.snap.ring.iter());
            for (u, _) in &l.snap.passed[..l.snap.passed.len() - 1] {
                m.step(&mut walk, u.b);
                push_span(ring, (u.start, u.end), self.cap);
            }
            return walk;
        }
        self.before(m, i - 1, ring)
    }

    /// Level `i` works on its own from its snapshot: the units it passed up
    /// since are walked, not passed again.
    fn desync(&mut self, m: &Matcher, i: usize) {
        let l = &mut self.lv()[i];
        debug_assert!(l.snap.active, "a level desyncs from its snapshot");
        l.snap.active = false;
        l.walk = l.snap.walk;
        l.prev = l.snap.walk;
        std::mem::swap(&mut l.ring, &mut l.snap.ring);
        l.plain_run = 0;
        l.synced = false;
        let passed = std::mem::take(&mut l.snap.passed);
        for &(u, literal) in &passed {
            self.step(m, i, u, literal);
        }
        self.lv()[i].snap.passed = passed;
    }

    fn step(&mut self, m: &Matcher, i: usize, o: Unit, literal: bool) {
        let cap = self.cap;
        let l = &mut self.lv()[i];
        l.prev = l.walk;
        let r = m.step(&mut l.walk, o.b) as usize;
        push_span(&mut l.ring, (o.start, o.end), cap);
        l.plain_run = if literal { l.plain_run + 1 } else { 0 };
        if r > 0 {
            let start = l.ring[l.ring.len() - r].0;
            self.add(start, o.end);
        }
    }

    /// Level `i` follows the level below again once its decoder is idle and
    /// the lower level finds all it could from here: its last `cap` units
    /// are the lower level's, or it is inside no run (a piece it could
    /// find then lies in units still to come, which the lower level sees
    /// as well; what the lower level finds besides is its own text).
    fn maybe_resync(&mut self, i: usize) {
        let cap = self.cap;
        let l = &mut self.lv()[i];
        if l.synced || !l.dec.idle() {
            return;
        }
        if l.plain_run >= cap || l.walk.len() == 0 {
            l.synced = true;
            l.ring.clear();
            if l.ring.capacity() > 64 {
                l.ring.shrink_to_fit();
            }
        }
    }

    /// The end of the text: every decoder decides what it holds.
    pub(crate) fn finish(&mut self, m: &Matcher) {
        self.rewalk(m, 0);
        let levels = if self.levels.is_some() { LEVELS } else { 0 };
        for i in 0..levels {
            let mut out = std::mem::take(&mut self.lv()[i].out);
            self.lv()[i].dec.finish(&mut out);
            for (o, literal) in out.drain(..) {
                self.emit(m, i, o, literal);
            }
            self.lv()[i].out = out;
            self.lv()[i].snap.active = false;
        }
        self.finished = true;
    }

    fn add(&mut self, start: u64, end: u64) {
        match self.ranges.last_mut() {
            // The usual case: a match that grows by one unit.
            Some(last) if last.0 <= start && start <= last.1 => last.1 = last.1.max(end),
            _ => self.ranges.push((start, end)),
        }
    }

    /// The first raw byte a later match could still cover: everything
    /// before it is decided.
    pub(crate) fn safe(&self) -> u64 {
        if self.finished {
            return self.pos;
        }
        let hold = |len: u32| u64::from(len.min(self.cap - 1));
        let mut safe = self.pos - hold(self.raw.len());
        for l in self.levels.iter().flat_map(|ls| ls.iter()) {
            if let Some(s) = l.dec.pending_start() {
                safe = safe.min(s);
            }
            if l.snap.active {
                safe = safe.min(l.snap.hold);
            }
            if !l.synced {
                let h = hold(l.walk.len()) as usize;
                if h > 0 {
                    safe = safe.min(l.ring[l.ring.len() - h].0);
                }
            }
        }
        safe
    }

    /// The ranges that lie wholly before the decided point, merged, and
    /// the point up to which bytes may be passed on (before any range that
    /// may still grow).
    pub(crate) fn take_decided(&mut self, ranges: &mut Vec<(u64, u64)>) -> u64 {
        let safe = self.safe();
        if self.ranges.is_empty() {
            return safe;
        }
        self.ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.ranges.len());
        for &(s, e) in &self.ranges {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        let limit = merged
            .iter()
            .filter(|r| r.1 > safe)
            .map(|r| r.0)
            .min()
            .unwrap_or(safe)
            .min(safe);
        self.ranges.clear();
        for r in merged {
            if r.1 <= limit {
                ranges.push(r);
            } else {
                self.ranges.push(r);
            }
        }
        limit
    }
}

/// Keep the span of a level's latest unit; `cap` of them at most.
fn push_span(ring: &mut VecDeque<(u64, u64)>, span: (u64, u64), cap: u32) {
    if ring.len() >= cap as usize {
        ring.pop_front();
    }
    ring.push_back(span);
}
