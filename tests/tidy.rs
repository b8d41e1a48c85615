//! The house rules, checked on every `cargo test` (TigerBeetle's
//! `src/tidy.zig` is the model): a rule that no test checks drifts (the
//! 70-line rule was met on 2026-11-25 and broken by nine functions a day
//! later). Each rule has a short exception list, every entry with its
//! reason; an entry that no longer applies fails the test too, so the lists
//! only shrink.
//!
//! The rules, over every file under `src/` (parsed with `syn`):
//! - no function longer than `MAX_FN_LINES` lines;
//! - `impl Engine` only in the engine's facade, `src/engine/mod.rs`;
//! - the table's lock (`meta.lock()`) taken only inside `src/engine/table/`;
//! - no module imports one from a floor above its own (`FLOORS`). Test-only
//!   code (`cfg(test)`, the `testing` feature) is not held to this one;
//! - no engine code outside a variant's own files tests which placement or
//!   writeback order the cache has (`VARIANT_SETTINGS`): it asks the
//!   engine's `Placer` or `Order`. Test-only code is not held to this one.
//!
//! `TIERCACHE_TIDY_EDGES=1 cargo test --test tidy -- --nocapture` prints every
//! import edge between modules with its floors.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::Visit;

const MAX_FN_LINES: usize = 70;

/// Functions allowed to be longer: (file, function, reason).
const LONG_FN_EXCEPTIONS: &[(&str, &str, &str)] = &[];

/// The reason the table-lock entries share: a step of the `Cache` that
/// takes the table's lock itself; as it becomes a method of the table
/// (`Meta`, `MetaLock`), its entry goes.
const TABLE_STEP: &str = "a Cache step that takes the table's lock itself";

/// Why open, recovery and the async wrapper import the facade they sit
/// under: they build the `Engine` (recovery) or hold one.
const AROUND: &str = "builds or holds the Engine, which re-exports it";

/// The one file where `impl Engine` belongs.
const ENGINE_FACADE: &str = "src/engine/mod.rs";

/// Files that still write their part's steps as `impl Engine` methods:
/// (file, reason). Issue 33 (the engine as Cache and Origin) moves them.
const IMPL_ENGINE_EXCEPTIONS: &[(&str, &str)] = &[];

/// Where the table's lock may be taken.
const TABLE_HOME: &str = "src/engine/table/";

/// Files outside `table/` that still take the table's lock: (file, sites,
/// reason). The count may only fall.
const TABLE_LOCK_EXCEPTIONS: &[(&str, usize, &str)] = &[
    ("src/engine/io/failure.rs", 1, TABLE_STEP),
    ("src/engine/journal/commit.rs", 3, TABLE_STEP),
    ("src/engine/mod.rs", 1, TABLE_STEP),
    ("src/engine/modes/write_cache.rs", 1, TABLE_STEP),
    ("src/engine/pipeline.rs", 4, TABLE_STEP),
    ("src/engine/read.rs", 3, TABLE_STEP),
    ("src/engine/write.rs", 2, TABLE_STEP),
    ("src/engine/writeback/clean.rs", 2, TABLE_STEP),
    ("src/engine/writeback/order/flush.rs", 4, TABLE_STEP),
    ("src/engine/writeback/run.rs", 6, TABLE_STEP),
];

/// The floors, ground up: a module may import modules on its own floor or
/// below. A module's floor is its longest prefix's here. The crate's folders
/// are tens apart; the engine's parts lie between 40 and 48, its facade
/// (`engine`, `mod.rs`) on top, so a part that imports the facade's
/// `Engine` runs up a floor.
const FLOORS: &[(&str, u32)] = &[
    ("sync", 10),
    ("units", 10),
    ("nbd", 10),
    ("device", 20),
    ("volume", 30),
    // The engine's ground: leaves that know no other part.
    ("engine::clock", 40),
    ("engine::stats", 40),
    ("engine::policy", 40),
    ("engine::observe", 40),
    ("engine::table::sectors", 40),
    ("engine::origin::locks", 40),
    ("engine::origin::stale", 40),
    ("engine::origin::flights", 40),
    ("engine::origin::address", 40),
    ("engine::io::warnings", 40),
    ("engine::modes", 40),
    // What a cache is made with, and its bytes on disk.
    ("engine::admission", 41),
    ("engine::options", 41),
    ("engine::format", 42),
    // The parts that own state (the table and the crash log that mirrors
    // its records stand on one floor, the origin beside them), and the
    // errors they raise.
    ("engine::table", 43),
    ("engine::origin", 43),
    ("engine::journal::crash_log", 43),
    ("engine::error", 43),
    // The cache part (cache/) and the parts whose steps are its methods
    // (`impl Cache` in io/, journal/, placement/, writeback/, the table's
    // slot steps) stand on one floor: they use each other's state through
    // the `Cache` that holds it.
    ("engine::cache", 44),
    ("engine::io", 44),
    ("engine::journal", 44),
    ("engine::writeback", 44),
    ("engine::placement", 44),
    ("engine::table::slots", 44),
    ("engine::request", 44),
    ("engine::status", 44),
    // The request path.
    ("engine::read", 46),
    ("engine::write", 46),
    ("engine::modes::write_cache", 46),
    ("engine::modes::write_through", 46),
    ("engine::modes::write_around", 46),
    ("engine::pipeline", 46),
    ("engine::delivery", 46),
    // Around the engine.
    ("engine::recovery", 48),
    ("engine::async_engine", 48),
    ("engine::load_fuzz", 48),
    ("engine", 49),
    ("frontend", 50),
    ("monitor", 50),
    ("daemon", 60),
    ("cli", 70),
];

/// Imports allowed to run up a floor: (importer module, imported module,
/// reason).
const UPWARD_IMPORT_EXCEPTIONS: &[(&str, &str, &str)] = &[
    ("engine::async_engine", "engine", AROUND),
    ("engine::load_fuzz", "engine", AROUND),
    ("engine::recovery", "engine", AROUND),
    (
        "engine::writeback::run",
        "engine",
        "the background thread and the lanes hold a weak handle on the Engine \
         (start_background)",
    ),
];

/// The settings that choose a variant: (enum, variant). A placement and a
/// writeback order are parts behind a trait (`placement::Placer`,
/// `writeback::order::Order`, one file per variant); the rest of the engine
/// asks the one it holds what to do, and never tests which one it is.
const VARIANT_SETTINGS: &[(&str, &str)] = &[
    ("Placement", "InPlace"),
    ("Placement", "Log"),
    ("WritebackOrder", "Address"),
    ("WritebackOrder", "Flush"),
];

/// Methods that were such tests (`Engine::ordered`), caught if they come
/// back.
const VARIANT_FLAG_METHODS: &[&str] = &["ordered"];

/// Where the variant rule holds.
const VARIANT_HOME: &str = "src/engine/";

/// Files under `VARIANT_HOME` that may name a variant's setting: (file,
/// reason).
const VARIANT_SETTING_EXCEPTIONS: &[(&str, &str)] = &[
    (
        "src/engine/options.rs",
        "the settings themselves: names, parsing, defaults",
    ),
    (
        "src/engine/recovery.rs",
        "the settings to and from the superblock's flags",
    ),
    (
        "src/engine/placement/mod.rs",
        "builds the placement a setting names",
    ),
    ("src/engine/placement/in_place.rs", "the variant's own file"),
    ("src/engine/placement/log.rs", "the variant's own file"),
    (
        "src/engine/writeback/order/mod.rs",
        "builds the order a setting names",
    ),
    (
        "src/engine/writeback/order/address.rs",
        "the variant's own file",
    ),
    (
        "src/engine/writeback/order/flush.rs",
        "the variant's own file",
    ),
];

/// One parsed source file.
struct Source {
    /// Relative to the crate root, with `/`.
    rel: String,
    /// The module path the file's items live in (the binary's `cli` tree is
    /// named from the library's root too: `cli::...`).
    module: Vec<String>,
    /// In the binary (`src/main.rs`, `src/cli/`).
    binary: bool,
    ast: syn::File,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn module_of(rel: &str) -> Vec<String> {
    let inner = rel.trim_start_matches("src/").trim_end_matches(".rs");
    let mut parts: Vec<String> = inner.split('/').map(String::from).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

fn sources() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    files
        .iter()
        .map(|path| {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(path).unwrap();
            let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{rel}: {e}"));
            Source {
                module: module_of(&rel),
                binary: rel == "src/main.rs" || rel.starts_with("src/cli/"),
                rel,
                ast,
            }
        })
        .collect()
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| match &a.meta {
        syn::Meta::List(l) if l.path.is_ident("cfg") => l.tokens.to_string().contains("test"),
        _ => false,
    })
}

/// Every module (files and inline `mod` blocks) and what each re-exports:
/// module -> name -> the path the name was imported by.
#[derive(Default)]
struct Modules {
    known: BTreeSet<Vec<String>>,
    reexports: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>,
}

impl Modules {
    fn of(sources: &[Source]) -> Modules {
        let mut m = Modules::default();
        for s in sources {
            m.known.insert(s.module.clone());
            m.collect(&s.module, &s.ast.items);
        }
        m
    }

    fn collect(&mut self, module: &[String], items: &[syn::Item]) {
        for item in items {
            match item {
                syn::Item::Mod(md) => {
                    let mut inner = module.to_vec();
                    inner.push(md.ident.to_string());
                    self.known.insert(inner.clone());
                    if let Some((_, items)) = &md.content {
                        self.collect(&inner, items);
                    }
                }
                syn::Item::Use(u) if !matches!(u.vis, syn::Visibility::Inherited) => {
                    for (name, path) in use_leaves(&u.tree) {
                        self.reexports
                            .entry(module.to_vec())
                            .or_default()
                            .insert(name, path);
                    }
                }
                _ => {}
            }
        }
    }

    /// The module a path from `module` lands in: `crate::`, `super::`,
    /// `self::`, a child module's name, or (in the binary) `tiercache::`.
    /// `None` for a path outside the crate.
    fn resolve(&self, module: &[String], path: &[String], binary: bool) -> Option<Vec<String>> {
        self.resolve_depth(module, path, binary, 0)
    }

    fn resolve_depth(
        &self,
        module: &[String],
        path: &[String],
        binary: bool,
        depth: u32,
    ) -> Option<Vec<String>> {
        let first = path.first()?;
        let (mut at, rest): (Vec<String>, &[String]) = match first.as_str() {
            "crate" | "tiercache" => (Vec::new(), &path[1..]),
            "self" => (module.to_vec(), &path[1..]),
            "super" => {
                let supers = path.iter().take_while(|s| *s == "super").count();
                let keep = module.len().checked_sub(supers)?;
                (module[..keep].to_vec(), &path[supers..])
            }
            _ => {
                let mut child = module.to_vec();
                child.push(first.clone());
                if !self.known.contains(&child) {
                    return None;
                }
                (module.to_vec(), path)
            }
        };
        if binary && first == "crate" && rest.first().is_some_and(|s| s != "cli") {
            return None;
        }
        for seg in rest {
            let mut next = at.clone();
            next.push(seg.clone());
            if self.known.contains(&next) {
                at = next;
                continue;
            }
            let target = self.reexports.get(&at).and_then(|r| r.get(seg));
            match target {
                Some(target) if depth < 8 => {
                    if let Some(t) = self.resolve_depth(&at, target, false, depth + 1) {
                        at = t;
                    }
                }
                _ => {}
            }
            break;
        }
        Some(at)
    }
}

/// (name bound, full path) of each leaf of a `use` tree; a glob's path
/// names its module.
fn use_leaves(tree: &syn::UseTree) -> Vec<(String, Vec<String>)> {
    fn walk(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<(String, Vec<String>)>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                walk(&p.tree, prefix, out);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                let mut path = prefix.clone();
                if name != "self" {
                    path.push(name.clone());
                }
                let bound = if name == "self" {
                    prefix.last().cloned().unwrap_or_default()
                } else {
                    name
                };
                out.push((bound, path));
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                if r.ident != "self" {
                    path.push(r.ident.to_string());
                }
                out.push((r.rename.to_string(), path));
            }
            syn::UseTree::Glob(_) => out.push(("*".into(), prefix.clone())),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    walk(t, prefix, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(tree, &mut Vec::new(), &mut out);
    out
}

/// What the scan of the sources found.
#[derive(Default)]
struct Findings {
    /// (file, function, line, lines)
    long_fns: Vec<(String, String, usize, usize)>,
    /// (file, line)
    impl_engine: Vec<(String, usize)>,
    /// file -> sites
    table_locks: BTreeMap<String, usize>,
    /// (importer module, imported module) -> first (file, line)
    imports: BTreeMap<(String, String), (String, usize)>,
    /// (file, line, what): a variant's setting named, or a flag method
    /// called, in the engine.
    variant_tests: Vec<(String, usize, String)>,
}

struct Scan<'a> {
    source: &'a Source,
    modules: &'a Modules,
    module: Vec<String>,
    test_depth: usize,
    found: &'a mut Findings,
}

impl Scan<'_> {
    fn function(&mut self, name: &syn::Ident, body: &syn::Block, start: proc_macro2::Span) {
        let first = start.start().line;
        let last = body.brace_token.span.close().end().line;
        let lines = last + 1 - first;
        if lines > MAX_FN_LINES {
            self.found
                .long_fns
                .push((self.source.rel.clone(), name.to_string(), first, lines));
        }
    }

    fn import(&mut self, path: &[String], line: usize) {
        if self.test_depth > 0 {
            return;
        }
        let Some(target) = self.modules.resolve(&self.module, path, self.source.binary) else {
            return;
        };
        if target.is_empty() || target == self.module {
            return;
        }
        let key = (self.module.join("::"), target.join("::"));
        self.found
            .imports
            .entry(key)
            .or_insert_with(|| (self.source.rel.clone(), line));
    }

    fn variant_test(&mut self, what: String, line: usize) {
        if self.test_depth == 0 && self.source.rel.starts_with(VARIANT_HOME) {
            let file = self.source.rel.clone();
            self.found.variant_tests.push((file, line, what));
        }
    }
}

impl<'ast> Visit<'ast> for Scan<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        let test = is_test_only(&m.attrs);
        self.module.push(m.ident.to_string());
        self.test_depth += test as usize;
        syn::visit::visit_item_mod(self, m);
        self.test_depth -= test as usize;
        self.module.pop();
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.function(&f.sig.ident, &f.block, f.sig.fn_token.span);
        let test = is_test_only(&f.attrs);
        self.test_depth += test as usize;
        syn::visit::visit_item_fn(self, f);
        self.test_depth -= test as usize;
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.function(&f.sig.ident, &f.block, f.sig.fn_token.span);
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(body) = &f.default {
            self.function(&f.sig.ident, body, f.sig.fn_token.span);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if let syn::Type::Path(p) = &*i.self_ty {
            if p.path.segments.last().is_some_and(|s| s.ident == "Engine") {
                let line = i.impl_token.span.start().line;
                self.found.impl_engine.push((self.source.rel.clone(), line));
            }
        }
        let test = is_test_only(&i.attrs);
        self.test_depth += test as usize;
        syn::visit::visit_item_impl(self, i);
        self.test_depth -= test as usize;
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let line = u.span().start().line;
        if !is_test_only(&u.attrs) {
            for (_, path) in use_leaves(&u.tree) {
                self.import(&path, line);
            }
        }
    }

    /// `pub(super)`, `pub(in crate::engine)`: who may see an item is not
    /// an import of the module named.
    fn visit_vis_restricted(&mut self, _: &'ast syn::VisRestricted) {}

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segs
            .first()
            .is_some_and(|s| matches!(s.as_str(), "crate" | "super" | "self" | "tiercache"))
        {
            self.import(&segs, p.span().start().line);
        }
        if let [.., ty, variant] = segs.as_slice() {
            if VARIANT_SETTINGS.contains(&(ty.as_str(), variant.as_str())) {
                self.variant_test(format!("{ty}::{variant}"), p.span().start().line);
            }
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_expr_method_call(&mut self, c: &'ast syn::ExprMethodCall) {
        let method = c.method.to_string();
        if c.args.is_empty() && VARIANT_FLAG_METHODS.contains(&method.as_str()) {
            self.variant_test(format!(".{method}()"), c.method.span().start().line);
        }
        let lock = matches!(c.method.to_string().as_str(), "lock" | "try_lock");
        if lock {
            if let syn::Expr::Field(f) = &*c.receiver {
                if matches!(&f.member, syn::Member::Named(n) if n == "meta") {
                    *self
                        .found
                        .table_locks
                        .entry(self.source.rel.clone())
                        .or_default() += 1;
                }
            }
        }
        syn::visit::visit_expr_method_call(self, c);
    }

    fn visit_item(&mut self, i: &'ast syn::Item) {
        // Every other item with a test-only cfg (a `const`, a `static`, a
        // `struct` used by tests) is test code too.
        let test = match i {
            syn::Item::Const(c) => is_test_only(&c.attrs),
            syn::Item::Static(s) => is_test_only(&s.attrs),
            syn::Item::Struct(s) => is_test_only(&s.attrs),
            syn::Item::Enum(e) => is_test_only(&e.attrs),
            syn::Item::Trait(t) => is_test_only(&t.attrs),
            _ => false,
        };
        self.test_depth += test as usize;
        syn::visit::visit_item(self, i);
        self.test_depth -= test as usize;
    }
}

fn scan() -> Findings {
    let sources = sources();
    let modules = Modules::of(&sources);
    let mut found = Findings::default();
    for source in &sources {
        let mut scan = Scan {
            source,
            modules: &modules,
            module: source.module.clone(),
            test_depth: 0,
            found: &mut found,
        };
        scan.visit_file(&source.ast);
    }
    found
}

fn floor(module: &str) -> Option<u32> {
    FLOORS
        .iter()
        .filter(|(prefix, _)| module == *prefix || module.starts_with(&format!("{prefix}::")))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|&(_, f)| f)
}

/// Fails with every problem found and every exception that no longer
/// applies.
fn report(rule: &str, problems: Vec<String>, stale: Vec<String>) {
    let mut text = String::new();
    if !problems.is_empty() {
        text += &format!(
            "{rule}: {} broken:\n  {}\n",
            problems.len(),
            problems.join("\n  ")
        );
    }
    if !stale.is_empty() {
        text += &format!(
            "{rule}: exceptions that no longer apply (remove them from tests/tidy.rs):\n  {}\n",
            stale.join("\n  ")
        );
    }
    assert!(text.is_empty(), "{text}");
}

#[test]
fn no_function_is_longer_than_70_lines() {
    let found = scan();
    let excused = |file: &str, name: &str| {
        LONG_FN_EXCEPTIONS
            .iter()
            .any(|(f, n, _)| *f == file && *n == name)
    };
    let problems = found
        .long_fns
        .iter()
        .filter(|(file, name, ..)| !excused(file, name))
        .map(|(file, name, line, lines)| format!("{file}:{line} {name}: {lines} lines"))
        .collect();
    let stale = LONG_FN_EXCEPTIONS
        .iter()
        .filter(|(f, n, _)| {
            !found
                .long_fns
                .iter()
                .any(|(file, name, ..)| file == f && name == n)
        })
        .map(|(f, n, _)| format!("{f} {n}"))
        .collect();
    report("functions over 70 lines", problems, stale);
}

#[test]
fn impl_engine_stands_only_in_the_facade() {
    let found = scan();
    let excused = |file: &str| {
        file == ENGINE_FACADE || IMPL_ENGINE_EXCEPTIONS.iter().any(|(f, _)| *f == file)
    };
    let problems = found
        .impl_engine
        .iter()
        .filter(|(file, _)| !excused(file))
        .map(|(file, line)| format!("{file}:{line}: `impl Engine` outside {ENGINE_FACADE}"))
        .collect();
    let stale = IMPL_ENGINE_EXCEPTIONS
        .iter()
        .filter(|(f, _)| !found.impl_engine.iter().any(|(file, _)| file == f))
        .map(|(f, _)| f.to_string())
        .collect();
    report("impl Engine", problems, stale);
}

#[test]
fn the_table_lock_is_taken_only_in_the_table() {
    let found = scan();
    let mut problems = Vec::new();
    let mut stale = Vec::new();
    for (file, &sites) in &found.table_locks {
        if file.starts_with(TABLE_HOME) {
            continue;
        }
        match TABLE_LOCK_EXCEPTIONS.iter().find(|(f, ..)| f == file) {
            Some(&(_, allowed, _)) if sites <= allowed => {
                if sites < allowed {
                    stale.push(format!(
                        "{file}: {sites} sites now, the list says {allowed}"
                    ));
                }
            }
            Some(&(_, allowed, _)) => {
                problems.push(format!("{file}: {sites} sites, {allowed} allowed"))
            }
            None => problems.push(format!("{file}: {sites} sites of `meta.lock()`")),
        }
    }
    for (f, ..) in TABLE_LOCK_EXCEPTIONS {
        if !found.table_locks.contains_key(*f) {
            stale.push(f.to_string());
        }
    }
    report("the table's lock outside table/", problems, stale);
}

#[test]
fn no_module_imports_from_a_floor_above() {
    let found = scan();
    let show = std::env::var_os("TIERCACHE_TIDY_EDGES").is_some();
    let mut problems = Vec::new();
    for ((from, to), (file, line)) in &found.imports {
        let (Some(f), Some(t)) = (floor(from), floor(to)) else {
            continue;
        };
        if show {
            println!("{f:>2} {from} -> {t:>2} {to}  ({file}:{line})");
        }
        let excused = UPWARD_IMPORT_EXCEPTIONS
            .iter()
            .any(|(a, b, _)| a == from && b == to);
        if t > f && !excused {
            problems.push(format!(
                "{file}:{line}: {from} (floor {f}) imports {to} (floor {t})"
            ));
        }
    }
    let stale = UPWARD_IMPORT_EXCEPTIONS
        .iter()
        .filter(|(a, b, _)| {
            !found.imports.keys().any(|(from, to)| from == a && to == b) || floor(a) >= floor(b)
        })
        .map(|(a, b, _)| format!("{a} -> {b}"))
        .collect();
    report("imports up a floor", problems, stale);
}

#[test]
fn variants_are_asked_not_tested() {
    let found = scan();
    let excused = |file: &str| VARIANT_SETTING_EXCEPTIONS.iter().any(|(f, _)| *f == file);
    let problems = found
        .variant_tests
        .iter()
        .filter(|(file, ..)| !excused(file))
        .map(|(file, line, what)| {
            format!("{file}:{line}: `{what}`: ask the engine's `Placer` or `Order` instead")
        })
        .collect();
    let stale = VARIANT_SETTING_EXCEPTIONS
        .iter()
        .filter(|(f, _)| !found.variant_tests.iter().any(|(file, ..)| file == f))
        .map(|(f, _)| f.to_string())
        .collect();
    report("variant settings tested", problems, stale);
}

#[test]
fn the_scan_sees_what_it_checks() {
    // The rules above pass vacuously if the scan finds nothing: it must see
    // the facade's `impl Engine`, the table's own lock sites, and the
    // daemon importing the engine.
    let found = scan();
    assert!(found.impl_engine.iter().any(|(f, _)| f == ENGINE_FACADE));
    assert!(found.table_locks.keys().any(|f| f.starts_with(TABLE_HOME)));
    assert!(found
        .imports
        .keys()
        .any(|(from, to)| from.starts_with("daemon") && to.starts_with("engine")));
}
