//! setfusion: GPU-accelerated set operators for Apache DataFusion.
//!
//! ```text
//! let state = setfusion::install(SessionStateBuilder::new().with_default_features()).build();
//! let ctx = SessionContext::new_with_state(state);
//! ```
//! installs the exact INTERSECT/EXCEPT [ALL] step, the GPU semi/anti join rule
//! and the `setfusion.*` settings (`SET setfusion.enabled = false`, ...).

pub mod algo;
pub mod config;
pub mod env;
pub mod exec;
pub mod gpu;
pub mod host;
pub mod keys;
pub mod planner;
pub mod scan;
pub mod udf;
pub mod util;

#[cfg(test)]
mod operator_tests;

use std::sync::Arc;

use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::prelude::{SessionConfig, SessionContext};

pub use config::SetfusionConfig;

/// Add setfusion to a session builder (call after `with_default_features()`).
/// The device is not opened here: the planner starts it in the background
/// for the first plan that uses it (or once a query whose operators would
/// have won on a started device has run), so sessions whose plans keep
/// DataFusion's operators never pay for it ([`gpu::readiness_if_started`]).
pub fn install(builder: SessionStateBuilder) -> SessionStateBuilder {
    let mut builder = builder;
    let config = builder.config().get_or_insert_with(SessionConfig::new).clone();
    let config = if config.options().extensions.get::<SetfusionConfig>().is_some() {
        config
    } else {
        config.with_option_extension(SetfusionConfig::default())
    };
    // Similarity and tokenizer functions (issue 4), added to whatever is registered.
    builder.scalar_functions().get_or_insert_with(Vec::new).extend(udf::functions());
    // Multiset aggregate (issue 15).
    builder.aggregate_functions().get_or_insert_with(Vec::new).extend(udf::aggregate_functions());
    // intersect_families (issue 15, seed 000).
    builder.table_functions().get_or_insert_with(Default::default).insert(
        udf::families::NAME.to_string(),
        Arc::new(datafusion::catalog::TableFunction::new(
            udf::families::NAME.to_string(),
            Arc::new(udf::families::IntersectFamilies),
        )),
    );
    // The semi/anti join rule runs right after DataFusion's join selection and
    // before distribution enforcement: a replaced join then gets no hash
    // repartitioning of its inputs (the operator reads all of them at once).
    let mut rules = PhysicalOptimizer::new().rules;
    // First: Parquet's float min / max leave NaN out; nothing may take them for bounds.
    rules.insert(0, Arc::new(planner::FloatStatisticsRule));
    let at = rules.iter().position(|r| r.name() == "join_selection").map_or(rules.len(), |i| i + 1);
    rules.insert(at, Arc::new(planner::SemiJoinRule));
    rules.push(Arc::new(planner::SimilarityJoinRule));
    // Before DataFusion's last filter pushdown, which makes the hash joins' dynamic filters.
    let at = rules.iter().position(|r| planner::is_last_filter_pushdown(r.as_ref())).unwrap_or(rules.len());
    rules.insert(at, Arc::new(planner::FloatKeyBoundsRule));
    // The inputs of operators that collect every partition at once, read by row ranges.
    rules.push(Arc::new(planner::ScanRangesRule));
    // Last: Parquet inputs of the set selections read by the device (the plan's shape is final).
    rules.push(Arc::new(planner::DeviceScanRule));
    // After it, on the scans DataFusion keeps, with their dynamic filters in place.
    rules.push(Arc::new(planner::UnprunedFloatFiltersRule));
    builder
        .with_config(config)
        .with_analyzer_rule(Arc::new(planner::SetOpRule))
        .with_analyzer_rule(Arc::new(planner::MarkJoinRule))
        // DataFusion's hashed IN lists tell -0.0 from 0.0; its `=` does not.
        .with_analyzer_rule(Arc::new(planner::FloatInListRule))
        // set_intersect_agg's accumulators see no session settings: the rule writes them in.
        .with_analyzer_rule(Arc::new(udf::multiset::IntersectAggSettingsRule))
        .with_physical_optimizer_rules(rules)
        .with_query_planner(Arc::new(planner::SetfusionQueryPlanner))
}

/// A `SessionContext` with DataFusion's defaults plus setfusion.
pub fn context() -> SessionContext {
    context_with_config(SessionConfig::new())
}

/// Like [`context`] with a caller-provided configuration.
pub fn context_with_config(config: SessionConfig) -> SessionContext {
    let state = install(SessionStateBuilder::new().with_config(config).with_default_features()).build();
    SessionContext::new_with_state(state)
}

/// The crate's layering (issue 16): every module only uses modules of its own
/// layer or below, `gpu` < `keys` / `scan` < `algo` < `exec` < `planner` / `udf`
/// / the crate root's sessions (`install`, `context`) < `operator_tests`
/// (the tools and Ballista, above them all, are the workspace's other packages);
/// `env`, `util` and `config` are usable by every layer. Checked on the source text: each `crate::<module>` path.
#[cfg(test)]
mod layering {
    fn rank(module: &str) -> Option<u32> {
        Some(match module {
            "env" | "util" | "config" | "host" => 0,
            "gpu" => 1,
            "keys" | "scan" => 2,
            "algo" => 3,
            "exec" => 4,
            // The crate root's sessions put the planner's rules and the functions together.
            "planner" | "udf" | "install" | "context" | "context_with_config" => 5,
            "operator_tests" => 6,
            _ => return None,
        })
    }

    fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    #[test]
    fn no_module_uses_a_higher_layer() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut upward = Vec::new();
        for f in &files {
            let rel = f.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
            let own = rel.split('/').next().unwrap().trim_end_matches(".rs").to_string();
            let Some(own_rank) = rank(&own) else { continue };
            for (n, line) in std::fs::read_to_string(f).unwrap().lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                for (at, _) in code.match_indices("crate::") {
                    let name: String =
                        code[at + 7..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    if rank(&name).is_some_and(|r| r > own_rank) {
                        upward.push(format!("{rel}:{}: {own} uses crate::{name}", n + 1));
                    }
                }
            }
        }
        assert!(upward.is_empty(), "imports from a lower layer to a higher one:\n{}", upward.join("\n"));
    }

    /// The source text with comments, string literals and char literals blanked
    /// to spaces (newlines kept, so byte offsets still give line numbers).
    fn code_only(text: &str) -> Vec<u8> {
        let b = text.as_bytes();
        let mut out = b.to_vec();
        let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
            for c in &mut out[from..to] {
                if *c != b'\n' {
                    *c = b' ';
                }
            }
        };
        let mut i = 0;
        while i < b.len() {
            let start = i;
            if b[i..].starts_with(b"//") {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            } else if b[i..].starts_with(b"/*") {
                let mut depth = 0;
                while i < b.len() {
                    if b[i..].starts_with(b"/*") {
                        depth += 1;
                        i += 2;
                    } else if b[i..].starts_with(b"*/") {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            } else if b[i] == b'r'
                && (i == 0 || !is_ident(b[i - 1]))
                && b.get(i + 1).is_some_and(|&c| c == b'"' || c == b'#')
            {
                // Raw string r"..." / r#"..."#.
                let mut j = i + 1;
                while j < b.len() && b[j] == b'#' {
                    j += 1;
                }
                if b.get(j) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', j - i - 1)).collect();
                i = j + 1;
                while i < b.len() && !b[i..].starts_with(&close) {
                    i += 1;
                }
                i = (i + close.len()).min(b.len());
            } else if b[i] == b'"' {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i = (i + 1).min(b.len());
            } else if b[i] == b'\'' {
                // A char literal ('x', '\n', '\u{..}'); a lifetime ('a) is left as is.
                if b.get(i + 1) == Some(&b'\\') {
                    i += 2;
                    while i < b.len() && b[i] != b'\'' {
                        i += 1;
                    }
                    i = (i + 1).min(b.len());
                } else if let Some(len) = text[i + 1..].chars().next().map(char::len_utf8) {
                    if b.get(i + 1 + len) == Some(&b'\'') {
                        i += len + 2;
                    } else {
                        i += 1;
                        continue;
                    }
                } else {
                    i += 1;
                    continue;
                }
            } else {
                i += 1;
                continue;
            }
            blank(&mut out, start, i);
        }
        out
    }

    fn is_ident(c: u8) -> bool {
        c.is_ascii_alphanumeric() || c == b'_'
    }

    /// The paths one `use` tree (or one inline path) starting at `at` names,
    /// each as its segments; a group `a::{b, c::d}` gives `a::b` and `a::c::d`,
    /// a glob or `self` in a group gives the path up to it.
    fn paths_at(code: &[u8], at: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let skip_ws = |at: &mut usize| {
            while *at < code.len() && code[*at].is_ascii_whitespace() {
                *at += 1;
            }
        };
        let mut segs = prefix.to_vec();
        loop {
            skip_ws(at);
            if code.get(*at) == Some(&b'{') {
                *at += 1;
                loop {
                    skip_ws(at);
                    match code.get(*at) {
                        Some(b'}') => {
                            *at += 1;
                            return;
                        }
                        Some(b',') => *at += 1,
                        None => return,
                        _ => {
                            let before = *at;
                            paths_at(code, at, &segs, out);
                            if *at == before {
                                *at += 1;
                            }
                        }
                    }
                }
            }
            let start = *at;
            while *at < code.len() && is_ident(code[*at]) {
                *at += 1;
            }
            let seg = std::str::from_utf8(&code[start..*at]).unwrap().to_string();
            if !seg.is_empty() && seg != "self" {
                segs.push(seg);
            }
            skip_ws(at);
            if code[*at..].starts_with(b"::") {
                *at += 2;
                continue;
            }
            break;
        }
        out.push(segs);
    }

    /// Every `crate::`, `super::` and `self::` path in a file's code, as an
    /// absolute module path, with the byte offset it starts at. `super` and
    /// `self` count from the module the path is written in, inline `mod x { }`
    /// blocks included.
    fn absolute_paths(code: &[u8], module: &[String]) -> Vec<(usize, Vec<String>)> {
        let mut found = Vec::new();
        let mut depth = 0usize;
        // Inline modules open at this point: (name, brace depth outside them).
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut pending_mod: Option<String> = None;
        let mut i = 0;
        while i < code.len() {
            let c = code[i];
            if c == b'{' {
                if let Some(name) = pending_mod.take() {
                    inline.push((name, depth));
                }
                depth += 1;
                i += 1;
                continue;
            }
            if c == b'}' {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                i += 1;
                continue;
            }
            if c == b';' {
                pending_mod = None;
            }
            if !is_ident(c) || (i > 0 && is_ident(code[i - 1])) {
                i += 1;
                continue;
            }
            let end = i + code[i..].iter().take_while(|&&c| is_ident(c)).count();
            let word = &code[i..end];
            let after_colons = i >= 2 && &code[i - 2..i] == b"::";
            if word == b"mod" {
                let mut j = end;
                while j < code.len() && code[j].is_ascii_whitespace() {
                    j += 1;
                }
                let k = j + code[j..].iter().take_while(|&&c| is_ident(c)).count();
                pending_mod = Some(std::str::from_utf8(&code[j..k]).unwrap().to_string());
                i = k;
                continue;
            }
            if after_colons || !code[end..].starts_with(b"::") || !matches!(word, b"crate" | b"super" | b"self") {
                i = end;
                continue;
            }
            let mut here: Vec<String> = module.to_vec();
            here.extend(inline.iter().map(|(n, _)| n.clone()));
            let mut base: Vec<String> = match word {
                b"crate" => Vec::new(),
                _ => here,
            };
            let mut at = end + 2;
            if word == b"super" {
                base.pop();
                loop {
                    let mut j = at;
                    while j < code.len() && code[j].is_ascii_whitespace() {
                        j += 1;
                    }
                    if code[j..].starts_with(b"super::") {
                        base.pop();
                        at = j + 7;
                    } else {
                        break;
                    }
                }
            }
            let mut paths = Vec::new();
            paths_at(code, &mut at, &base, &mut paths);
            found.extend(paths.into_iter().map(|p| (i, p)));
            i = at.max(end);
        }
        found
    }

    /// No two files of the crate import from each other, directly or around a
    /// longer loop (issue 29): a shared type lives in a neutral file both import.
    ///
    /// The graph is built from the source text: each `crate::`, `super::` and
    /// `self::` path (inline ones and `use` trees alike) is an edge from its
    /// file to the file that defines the longest module prefix of the path
    /// (`crate::exec::set_select::Backend` points at `exec/set_select.rs`,
    /// `crate::exec::DeviceMetrics` at `exec/mod.rs`). Edges between a module
    /// file (`mod.rs`, `lib.rs`, or `x.rs` with an `x/` folder) and its direct
    /// children are ignored both ways: a parent declares and re-exports its
    /// children, and children use the parent's shared items, by design.
    /// Paths without `crate`/`super`/`self` (relative `use child::X` in a
    /// parent) are not seen; those only go from a parent to its children.
    /// The library starts host threads in `host.rs` alone (issue 29): its
    /// pool, its background thread, and the named threads of `host::scope` /
    /// `host::spawn`. (The tools, which measure thread starts, may start their own.)
    #[test]
    fn host_threads_start_in_host_only() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut found = Vec::new();
        for f in &files {
            let rel = f.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
            if rel == "host.rs" {
                continue;
            }
            let code = String::from_utf8(code_only(&std::fs::read_to_string(f).unwrap())).unwrap();
            for (n, line) in code.lines().enumerate() {
                if ["thread::scope", "thread::spawn", "thread::Builder"].iter().any(|s| line.contains(s)) {
                    found.push(format!("{rel}:{}: {}", n + 1, line.trim()));
                }
            }
        }
        assert!(found.is_empty(), "host threads started outside src/host.rs:\n{}", found.join("\n"));
    }

    /// Every package of the workspace: the library, the tools and Ballista.
    #[test]
    fn no_import_cycle_between_files() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let cycles: Vec<String> =
            ["src", "tools/src", "ballista/src"].iter().flat_map(|dir| cycles_in(&root.join(dir))).collect();
        assert!(cycles.is_empty(), "files that import from each other:\n{}", cycles.join("\n"));
    }

    /// The import cycles between the files of the crate whose sources are in `src`.
    fn cycles_in(src: &std::path::Path) -> Vec<String> {
        let mut files = Vec::new();
        rust_files(src, &mut files);
        files.sort();
        // Module path of each file; src/bin/ holds separate crates.
        let mut modules: Vec<(String, Vec<String>)> = Vec::new();
        for f in &files {
            let rel = f.strip_prefix(src).unwrap().to_string_lossy().replace('\\', "/");
            if rel.starts_with("bin/") {
                continue;
            }
            let mut segs: Vec<String> = rel.trim_end_matches(".rs").split('/').map(str::to_string).collect();
            if matches!(segs.last().map(String::as_str), Some("mod" | "lib")) {
                segs.pop();
            }
            modules.push((rel, segs));
        }
        let file_of = |path: &[String]| -> usize {
            (0..=path.len()).rev().find_map(|n| modules.iter().position(|(_, m)| m.as_slice() == &path[..n])).unwrap()
        };
        // edges[a] = (b, where in a) for each file b that file a imports from.
        let mut edges: Vec<Vec<(usize, String)>> = vec![Vec::new(); modules.len()];
        for (a, (rel, module)) in modules.iter().enumerate() {
            let text = std::fs::read_to_string(src.join(rel)).unwrap();
            let code = code_only(&text);
            for (at, path) in absolute_paths(&code, module) {
                let b = file_of(&path);
                let other = &modules[b].1;
                let parent_child = (module.len() + 1 == other.len() && other.starts_with(module))
                    || (other.len() + 1 == module.len() && module.starts_with(other));
                if b == a || parent_child || edges[a].iter().any(|(x, _)| *x == b) {
                    continue;
                }
                let line = code[..at].iter().filter(|&&c| c == b'\n').count() + 1;
                edges[a].push((b, format!("{rel}:{line}: {}", path.join("::"))));
            }
        }
        // Tarjan's strongly connected components; each one of more than one file holds a cycle.
        struct Tarjan<'a> {
            edges: &'a [Vec<(usize, String)>],
            index: Vec<Option<usize>>,
            low: Vec<usize>,
            on_stack: Vec<bool>,
            stack: Vec<usize>,
            next: usize,
            components: Vec<Vec<usize>>,
        }
        impl Tarjan<'_> {
            fn visit(&mut self, v: usize) {
                self.index[v] = Some(self.next);
                self.low[v] = self.next;
                self.next += 1;
                self.stack.push(v);
                self.on_stack[v] = true;
                for w in self.edges[v].iter().map(|(w, _)| *w).collect::<Vec<_>>() {
                    match self.index[w] {
                        None => {
                            self.visit(w);
                            self.low[v] = self.low[v].min(self.low[w]);
                        }
                        Some(i) if self.on_stack[w] => self.low[v] = self.low[v].min(i),
                        Some(_) => {}
                    }
                }
                if Some(self.low[v]) == self.index[v] {
                    let mut component = Vec::new();
                    while let Some(w) = self.stack.pop() {
                        self.on_stack[w] = false;
                        component.push(w);
                        if w == v {
                            break;
                        }
                    }
                    self.components.push(component);
                }
            }
        }
        let n = modules.len();
        let mut t = Tarjan {
            edges: &edges,
            index: vec![None; n],
            low: vec![0; n],
            on_stack: vec![false; n],
            stack: Vec::new(),
            next: 0,
            components: Vec::new(),
        };
        for v in 0..n {
            if t.index[v].is_none() {
                t.visit(v);
            }
        }
        let mut cycles = Vec::new();
        for component in t.components.iter().filter(|c| c.len() > 1) {
            let mut names: Vec<&str> = component.iter().map(|&v| modules[v].0.as_str()).collect();
            names.sort();
            let mut lines = vec![format!("cycle among {}:", names.join(", "))];
            for &v in component {
                for (w, at) in &edges[v] {
                    if component.contains(w) {
                        lines.push(format!("  {at} -> {}", modules[*w].0));
                    }
                }
            }
            cycles.push(lines.join("\n"));
        }
        cycles
    }
}
