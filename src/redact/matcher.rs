//! Which runs of text are pieces of a secret's forms: a suffix automaton
//! over every form (the secret, its base64 at each alignment, its hex),
//! stepped one byte at a time, that knows at each byte the longest run
//! ending there that occurs in some form.
//!
//! Why not `aho-corasick`, which tessera otherwise prefers: "any piece of
//! at least k bytes" is, for a pattern matcher, every k-byte window of
//! every form as a pattern. A trie of those windows grows with the square
//! of the secret's length: a 1,200-byte JWT access token (forms of about
//! 9,000 bytes, k = 600) would need millions of states. A suffix
//! automaton recognises every substring of the forms in at most twice
//! their length in states, and its walk over text costs one or two table
//! steps per byte whatever the secret (`bench/micro.rs` measures it).
//!
//! Bytes are compared after [`normal`]: ASCII case folded (an echo in
//! another case, hex in either case) and the URL-safe base64 letters
//! folded into the standard ones (one base64 form covers both alphabets).

/// A state's number. The root is 0.
type Id = u32;

/// The byte as the automaton sees it: lower case, `-` as `+`, `_` as `/`.
/// NUL stays NUL and is never part of a form: it separates them.
pub(crate) const fn normal(b: u8) -> u8 {
    match b {
        b'A'..=b'Z' => b + 32,
        b'-' => b'+',
        b'_' => b'/',
        _ => b,
    }
}

static NORMAL: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = normal(i as u8);
        i += 1;
    }
    t
};

#[derive(Debug, Clone, Copy)]
struct State {
    /// The longest string this state stands for.
    len: u32,
    /// The state of its longest proper suffix that stands elsewhere.
    link: Id,
    /// Its edges: `edge_byte[first..first + count]`, sorted.
    first: u32,
    count: u32,
    /// The shortest run that counts as a piece of a secret whose forms
    /// hold this state's strings (`u32::MAX`: none does).
    threshold: u32,
    /// The longest redaction a shorter suffix (along the links) calls for.
    via_links: u32,
    /// Its row in `dense` (a state with many edges), or `NONE`.
    row: u32,
}

/// States with more edges than this get a row of the dense table: the
/// states of the first few bytes of a run have an edge for most letters,
/// and a linear search through them cost more than everything else.
const SPARSE_MAX: u32 = 4;

/// The automaton. Immutable once built; shared by every stream.
pub(crate) struct Matcher {
    states: Vec<State>,
    edge_byte: Vec<u8>,
    edge_next: Vec<Id>,
    /// Each byte's class: its index in a dense row, 0 for a byte no form
    /// holds (it ends any run at once).
    class: [u8; 256],
    classes: usize,
    /// Rows of `classes` next states, for the states with many edges (the
    /// root among them).
    dense: Vec<Id>,
    /// The largest threshold of any secret.
    longest_threshold: u32,
    /// The q-gram filter: a bit for the hash of every run of `q` bytes in
    /// a form (`q` is at most the smallest threshold, so a piece holds at
    /// least one run, and every position inside a piece ends one).
    grams: Vec<u64>,
    gram_bits: u32,
    q: u32,
}

impl std::fmt::Debug for Matcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Matcher({} states)", self.states.len())
    }
}

/// Where a walk is: the state and the length of the run it matched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Walk {
    state: Id,
    len: u32,
}

impl Walk {
    /// The length of the longest run ending here that is in some form.
    pub(crate) fn len(self) -> u32 {
        self.len
    }
}

const NONE: Id = Id::MAX;

impl Matcher {
    /// Build the automaton over `forms`: each form's bytes and the
    /// threshold of the secret it came from.
    pub(crate) fn new<'a>(forms: impl IntoIterator<Item = (&'a [u8], u32)>) -> Matcher {
        let mut b = Builder::new();
        for (form, threshold) in forms {
            b.add(form, threshold);
        }
        b.finish()
    }

    /// The length of the runs the q-gram filter knows.
    pub(crate) fn q(&self) -> u32 {
        self.q
    }

    /// Whether a run of `q` normalised bytes (packed by [`pack`]) could be
    /// part of a form. `false` is certain; `true` may be a false hit.
    #[inline]
    pub(crate) fn gram(&self, packed: u32) -> bool {
        let h = gram_hash(packed, self.gram_bits);
        self.grams[h / 64] & (1 << (h % 64)) != 0
    }

    /// Whether `b` could be in a form at all.
    #[inline]
    pub(crate) fn in_forms(&self, b: u8) -> bool {
        self.class[usize::from(NORMAL[usize::from(b)])] != 0
    }

    pub(crate) fn longest_threshold(&self) -> u32 {
        self.longest_threshold
    }

    #[inline]
    fn next(&self, s: Id, c: u8, k: usize) -> Id {
        let st = &self.states[s as usize];
        if st.row != NONE {
            return self.dense[st.row as usize * self.classes + k];
        }
        let (first, count) = (st.first as usize, st.count as usize);
        let bytes = &self.edge_byte[first..first + count];
        match bytes.iter().position(|&e| e == c) {
            Some(i) => self.edge_next[first + i],
            None => NONE,
        }
    }

    /// Step over byte `b`; returns how many units ending here (this one
    /// included) must be redacted, 0 for none.
    #[inline]
    pub(crate) fn step(&self, w: &mut Walk, b: u8) -> u32 {
        let c = NORMAL[usize::from(b)];
        let k = usize::from(self.class[usize::from(c)]);
        if k == 0 {
            // In no form: no run goes on through it.
            *w = Walk::default();
            return 0;
        }
        let mut s = w.state;
        let mut len = w.len;
        loop {
            let n = self.next(s, c, k);
            if n != NONE {
                s = n;
                len += 1;
                break;
            }
            if s == 0 {
                len = 0;
                break;
            }
            s = self.states[s as usize].link;
            len = self.states[s as usize].len;
        }
        *w = Walk { state: s, len };
        if len == 0 {
            return 0;
        }
        let st = &self.states[s as usize];
        let here = if len >= st.threshold { st.threshold } else { 0 };
        here.max(st.via_links)
    }
}

/// Up to four normalised bytes as one number, the last in the low bits.
pub(crate) fn pack(w: &[u8]) -> u32 {
    w.iter()
        .fold(0u32, |g, &b| (g << 8) | u32::from(NORMAL[usize::from(b)]))
}

/// The normalised byte, for packing as the text streams.
#[inline]
pub(crate) fn normalised(b: u8) -> u8 {
    NORMAL[usize::from(b)]
}

fn gram_hash(packed: u32, log2: u32) -> usize {
    (packed.wrapping_mul(0x9E37_79B1) >> (32 - log2)) as usize
}

/// The online construction (Blumer et al.), edges in maps until the end.
struct Builder {
    len: Vec<u32>,
    link: Vec<Id>,
    edges: Vec<std::collections::BTreeMap<u8, Id>>,
    /// The smallest threshold of the secrets whose forms end at each
    /// state's first position (propagated up the links at the end).
    threshold: Vec<u32>,
    last: Id,
    /// The forms, normalised, separated by NUL (for the q-gram filter).
    forms: Vec<u8>,
    forms_len: usize,
}

impl Builder {
    fn new() -> Builder {
        Builder {
            len: vec![0],
            link: vec![NONE],
            edges: vec![Default::default()],
            threshold: vec![u32::MAX],
            last: 0,
            forms: Vec::new(),
            forms_len: 0,
        }
    }

    fn state(&mut self, len: u32, link: Id, edges: std::collections::BTreeMap<u8, Id>) -> Id {
        self.len.push(len);
        self.link.push(link);
        self.edges.push(edges);
        self.threshold.push(u32::MAX);
        (self.len.len() - 1) as Id
    }

    fn add(&mut self, form: &[u8], threshold: u32) {
        for &b in form {
            let c = NORMAL[usize::from(b)];
            // NUL cannot be in a header value; it is the separator.
            if c != 0 {
                self.extend(c, threshold);
                self.forms.push(c);
                self.forms_len += 1;
            }
        }
        self.extend(0, u32::MAX);
        self.forms.push(0);
    }

    fn extend(&mut self, c: u8, threshold: u32) {
        let cur = self.state(self.len[self.last as usize] + 1, NONE, Default::default());
        self.threshold[cur as usize] = threshold;
        let mut p = self.last;
        while p != NONE && !self.edges[p as usize].contains_key(&c) {
            self.edges[p as usize].insert(c, cur);
            p = self.link[p as usize];
        }
        if p == NONE {
            self.link[cur as usize] = 0;
        } else {
            let q = self.edges[p as usize][&c];
            if self.len[p as usize] + 1 == self.len[q as usize] {
                self.link[cur as usize] = q;
            } else {
                let edges = self.edges[q as usize].clone();
                let clone = self.state(self.len[p as usize] + 1, self.link[q as usize], edges);
                while p != NONE && self.edges[p as usize].get(&c) == Some(&q) {
                    self.edges[p as usize].insert(c, clone);
                    p = self.link[p as usize];
                }
                self.link[q as usize] = clone;
                self.link[cur as usize] = clone;
            }
        }
        self.last = cur;
    }

    fn finish(self) -> Matcher {
        let n = self.len.len();
        // A state's strings end wherever its descendants' (along links)
        // do: the smallest threshold flows up the link tree, from longer
        // states to shorter ones.
        let mut order: Vec<Id> = (0..n as Id).collect();
        order.sort_unstable_by_key(|&s| std::cmp::Reverse(self.len[s as usize]));
        let mut threshold = self.threshold;
        for &s in &order {
            let l = self.link[s as usize];
            if l != NONE {
                threshold[l as usize] = threshold[l as usize].min(threshold[s as usize]);
            }
        }
        // Shorter suffixes first, so a state's link is done before it.
        let mut via_links = vec![0u32; n];
        for &s in order.iter().rev() {
            let l = self.link[s as usize];
            if l != NONE {
                let own = if self.len[l as usize] >= threshold[l as usize] {
                    threshold[l as usize]
                } else {
                    0
                };
                via_links[s as usize] = via_links[l as usize].max(own);
            }
        }
        let mut class = [0u8; 256];
        let mut classes = 1;
        for edges in &self.edges {
            for &c in edges.keys() {
                if c != 0 && class[usize::from(c)] == 0 {
                    class[usize::from(c)] = classes as u8;
                    classes += 1;
                }
            }
        }
        let mut states = Vec::with_capacity(n);
        let mut edge_byte = Vec::new();
        let mut edge_next = Vec::new();
        let mut dense = Vec::new();
        for s in 0..n {
            let first = edge_byte.len() as u32;
            let edges = self.edges[s].iter().filter(|(&c, _)| c != 0);
            let count = edges.clone().count() as u32;
            let mut row = NONE;
            if count > SPARSE_MAX || s == 0 {
                row = (dense.len() / classes) as u32;
                let at = dense.len();
                dense.resize(at + classes, NONE);
                for (&c, &t) in edges {
                    dense[at + usize::from(class[usize::from(c)])] = t;
                }
            } else {
                for (&c, &t) in edges {
                    edge_byte.push(c);
                    edge_next.push(t);
                }
            }
            states.push(State {
                len: self.len[s],
                link: if s == 0 { 0 } else { self.link[s] },
                first,
                count: edge_byte.len() as u32 - first,
                threshold: threshold[s],
                via_links: via_links[s],
                row,
            });
        }
        let longest_threshold = threshold
            .iter()
            .copied()
            .filter(|&t| t != u32::MAX)
            .max()
            .unwrap_or(0);
        let shortest = threshold.iter().copied().min().unwrap_or(1).max(1);
        let q = shortest.min(4);
        // About one bit in 64 set: a false hit in a few percent of the
        // positions of ordinary text costs a few steps of the walk.
        let gram_bits = (self.forms_len * 64)
            .next_power_of_two()
            .clamp(1 << 12, 1 << 22);
        let mut grams = vec![0u64; gram_bits / 64];
        let log2 = gram_bits.trailing_zeros();
        for form in self.forms.split(|&b| b == 0) {
            for w in form.windows(q as usize) {
                let h = gram_hash(pack(w), log2);
                grams[h / 64] |= 1 << (h % 64);
            }
        }
        Matcher {
            states,
            edge_byte,
            edge_next,
            class,
            classes,
            dense,
            longest_threshold,
            grams,
            gram_bits: log2,
            q,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (end, count) the matcher asks to redact over `text`.
    fn redactions(m: &Matcher, text: &[u8]) -> Vec<(usize, u32)> {
        let mut w = Walk::default();
        text.iter()
            .enumerate()
            .filter_map(|(i, &b)| {
                let r = m.step(&mut w, b);
                (r > 0).then_some((i + 1, r))
            })
            .collect()
    }

    /// The same by brute force: for each end, the longest suffix that is a
    /// substring of a form, compared normalised.
    fn brute(forms: &[(&[u8], u32)], text: &[u8]) -> Vec<(usize, u32)> {
        let n = |s: &[u8]| s.iter().map(|&b| normal(b)).collect::<Vec<u8>>();
        let text = n(text);
        let mut out = vec![];
        for end in 1..=text.len() {
            let mut best = 0;
            for (form, t) in forms {
                let form = n(form);
                let t = *t as usize;
                if end >= t && form.windows(t).any(|w| w == &text[end - t..end]) {
                    best = best.max(t as u32);
                }
            }
            if best > 0 {
                out.push((end, best));
            }
        }
        out
    }

    #[test]
    fn agrees_with_brute_force() {
        let forms: [(&[u8], u32); 3] = [
            (b"s3cr3t-Zq8mX1vPabcd", 8),
            (b"czNjcjN0LVpxOG1YMXZQ", 10),
            (b"aaaaab", 3),
        ];
        let m = Matcher::new(forms);
        for text in [
            &b"xx s3cr3t-Zq8 yy"[..],
            b"S3CR3T_zQ8MX1VP",
            b"zzczNjcjN0LVpxOG1YMXZQzz",
            b"aaaaaaaaab aab aaa",
            b"Zq8mX1vPab\0cd s3cr3t",
            b"",
            b"q8mX1vPa",
        ] {
            assert_eq!(redactions(&m, text), brute(&forms, text), "{text:?}");
        }
        // Every byte string up to length 6 over a small alphabet.
        let alphabet = b"as3b";
        let forms: [(&[u8], u32); 2] = [(b"aas3ab", 3), (b"bbsa", 2)];
        let m = Matcher::new(forms);
        let mut stack = vec![vec![]];
        while let Some(t) = stack.pop() {
            assert_eq!(redactions(&m, &t), brute(&forms, &t), "{t:?}");
            if t.len() < 6 {
                for &c in alphabet {
                    let mut u = t.clone();
                    u.push(c);
                    stack.push(u);
                }
            }
        }
    }

    #[test]
    fn size_grows_with_the_forms_not_their_square() {
        let long: Vec<u8> = (0..9000u32)
            .map(|i| {
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
                    [(i.wrapping_mul(2654435761) >> 7) as usize % 64]
            })
            .collect();
        let m = Matcher::new([(&long[..], 600)]);
        assert!(m.states.len() <= 2 * long.len() + 2, "{}", m.states.len());
    }
}
