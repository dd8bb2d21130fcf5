//! The library's layering, held by a test: read every file of `src/` (the
//! binary's `main.rs` and `cli/` aside), find which modules each one uses,
//! and fail when a folder uses one above it in [`LAYERS`], when folders
//! form a cycle, or when the files of one folder do.
//!
//! Paths are read with `syn`, so comments and doc links do not count, and
//! neither do `#[cfg(test)]` items: a unit test may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The library's folders (and top-level files), top to bottom: each may
/// use only those on a later line. Modules on one line are peers that do
/// not use each other.
const LAYERS: &[&[&str]] = &[
    &["fuzzing"],
    &["serve"],
    &["admin"],
    &["proxy"],
    &["state"],
    &["snapshot"],
    &["authz"],
    &["model"],
    &["credentials"],
    &["audit"],
    &["config"],
    &["limits"],
    &["upstream"],
    &["store"],
    &["redact"],
    &["wire", "crypto", "telemetry"],
];

/// A module's path from the crate root (`["proxy", "forward"]`).
type Module = Vec<String>;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every library module and its file.
fn modules() -> BTreeMap<Module, PathBuf> {
    fn walk(dir: &Path, prefix: &[String], out: &mut BTreeMap<Module, PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let mut module = prefix.to_vec();
            if path.is_dir() {
                if prefix.is_empty() && name == "cli" {
                    continue;
                }
                module.push(name);
                walk(&path, &module, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                match name.as_str() {
                    "lib" if prefix.is_empty() => continue,
                    "main" if prefix.is_empty() => continue,
                    "mod" => {}
                    _ => module.push(name),
                }
                out.insert(module, path);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&src(), &[], &mut out);
    out
}

/// The paths a file names outside its `#[cfg(test)]` items.
#[derive(Default)]
struct Paths(Vec<Vec<String>>);

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

impl Paths {
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut p = prefix.clone();
                if n.ident != "self" {
                    p.push(n.ident.to_string());
                }
                self.0.push(p);
            }
            syn::UseTree::Rename(r) => {
                let mut p = prefix.clone();
                p.push(r.ident.to_string());
                self.0.push(p);
            }
            syn::UseTree::Glob(_) => self.0.push(prefix.clone()),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item(&mut self, i: &'ast syn::Item) {
        let attrs = match i {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(x) => &x.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            _ => return syn::visit::visit_item(self, i),
        };
        if !is_test(attrs) {
            syn::visit::visit_item(self, i);
        }
    }
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }
    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.0
            .push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }
    // `crate::x::y!` and paths inside macro calls (`format!`,
    // `tracing::info!`) are token streams: read them as paths too.
    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        let tokens: Vec<String> = m
            .tokens
            .to_string()
            .split_whitespace()
            .map(String::from)
            .collect();
        let mut i = 0;
        while i < tokens.len() {
            if tokens[i] == "crate" || tokens[i] == "super" {
                let mut p = vec![tokens[i].clone()];
                let mut j = i + 1;
                while j + 1 < tokens.len() && tokens[j] == "::" {
                    p.push(tokens[j + 1].clone());
                    j += 2;
                }
                self.0.push(p);
                i = j;
            } else {
                i += 1;
            }
        }
    }
}

/// The modules `module`'s file uses, other than itself.
fn uses(module: &Module, file: &Path, all: &BTreeMap<Module, PathBuf>) -> BTreeSet<Module> {
    let ast = syn::parse_file(&std::fs::read_to_string(file).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut paths = Paths::default();
    paths.visit_file(&ast);
    let is_mod_rs = file.file_name().is_some_and(|n| n == "mod.rs");
    let mut out = BTreeSet::new();
    for p in paths.0 {
        let Some(first) = p.first() else { continue };
        // Where the path starts: the crate, the parent, or this module
        // (a child module or `self::`).
        let (mut base, rest): (Module, &[String]) = match first.as_str() {
            "crate" => (Vec::new(), &p[1..]),
            "super" => {
                // In `a/b.rs` (module a::b), `super` is `a`; in `a/mod.rs`
                // (module a) it is the crate.
                let mut b = module.clone();
                b.pop();
                let mut rest = &p[1..];
                while rest.first().is_some_and(|s| s == "super") {
                    b.pop();
                    rest = &rest[1..];
                }
                (b, rest)
            }
            "self" => (module.clone(), &p[1..]),
            _ => {
                let mut child = module.clone();
                child.push(first.clone());
                if all.contains_key(&child) && (is_mod_rs || module.is_empty()) {
                    (module.clone(), &p[..])
                } else {
                    continue;
                }
            }
        };
        // The longest prefix that is a module.
        let mut found = all.contains_key(&base).then(|| base.clone());
        for seg in rest {
            base.push(seg.clone());
            if all.contains_key(&base) {
                found = Some(base.clone());
            } else {
                break;
            }
        }
        if let Some(m) = found {
            if &m != module && !m.is_empty() {
                out.insert(m);
            }
        }
    }
    out
}

fn graph() -> BTreeMap<Module, BTreeSet<Module>> {
    let all = modules();
    all.iter()
        .map(|(m, f)| (m.clone(), uses(m, f, &all)))
        .collect()
}

/// The cycles of a graph: its strongly connected components of more than
/// one node (Tarjan's algorithm, written for clarity over speed).
fn cycles<N: Ord + Clone>(g: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    struct T<'a, N> {
        g: &'a BTreeMap<N, BTreeSet<N>>,
        index: BTreeMap<N, usize>,
        low: BTreeMap<N, usize>,
        stack: Vec<N>,
        on: BTreeSet<N>,
        out: Vec<Vec<N>>,
    }
    impl<N: Ord + Clone> T<'_, N> {
        fn visit(&mut self, v: &N) {
            let i = self.index.len();
            self.index.insert(v.clone(), i);
            self.low.insert(v.clone(), i);
            self.stack.push(v.clone());
            self.on.insert(v.clone());
            for w in self.g.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let l = self.low[w].min(self.low[v]);
                    self.low.insert(v.clone(), l);
                } else if self.on.contains(w) {
                    let l = self.index[w].min(self.low[v]);
                    self.low.insert(v.clone(), l);
                }
            }
            if self.low[v] == self.index[v] {
                let mut c = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on.remove(&w);
                    let done = &w == v;
                    c.push(w);
                    if done {
                        break;
                    }
                }
                if c.len() > 1 {
                    c.reverse();
                    self.out.push(c);
                }
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out
}

fn show(m: &Module) -> String {
    m.join("::")
}

#[test]
fn folders_use_only_the_layers_below_them() {
    let rank = |top: &str| {
        LAYERS
            .iter()
            .position(|l| l.contains(&top))
            .unwrap_or_else(|| panic!("src/{top} is in no layer of tests/layout.rs"))
    };
    let mut wrong = Vec::new();
    for (m, deps) in graph() {
        for d in deps {
            if m[0] != d[0] && rank(&d[0]) <= rank(&m[0]) {
                wrong.push(format!("{} uses {}", show(&m), show(&d)));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "uses against the layering:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_module_cycles() {
    let g = graph();
    let mut found = Vec::new();
    // Between folders.
    let mut folders: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, deps) in &g {
        let e = folders.entry(m[0].clone()).or_default();
        e.extend(deps.iter().map(|d| d[0].clone()).filter(|d| *d != m[0]));
    }
    for c in cycles(&folders) {
        found.push(format!("folders: {}", c.join(" → ")));
    }
    // Between the files of one folder.
    for c in cycles(&g) {
        found.push(format!(
            "files: {}",
            c.iter().map(show).collect::<Vec<_>>().join(" → ")
        ));
    }
    assert!(found.is_empty(), "dependency cycles:\n{}", found.join("\n"));
}

/// The checker itself sees a use, a cycle and a layering breach.
#[test]
fn the_checker_sees_what_it_checks() {
    let m = |s: &str| -> Module { s.split("::").map(String::from).collect() };
    let g: BTreeMap<Module, BTreeSet<Module>> = [
        (m("a"), BTreeSet::from([m("b")])),
        (m("b"), BTreeSet::from([m("c")])),
        (m("c"), BTreeSet::from([m("a")])),
        (m("d"), BTreeSet::new()),
    ]
    .into();
    assert_eq!(cycles(&g), vec![vec![m("a"), m("b"), m("c")]]);
    // Real files: the proxy's handler uses its stages, the stages the
    // store below them.
    let g = graph();
    assert!(g[&m("proxy")].contains(&m("proxy::route")));
    assert!(g[&m("proxy::route")].contains(&m("proxy::error")));
    assert!(g[&m("audit")].contains(&m("store")));
    assert!(!g[&m("store")].contains(&m("audit")));
}
