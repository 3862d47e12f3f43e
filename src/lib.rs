//! setfusion: GPU-accelerated set operators for Apache DataFusion.
//!
//! ```text
//! let state = setfusion::install(SessionStateBuilder::new().with_default_features()).build();
//! let ctx = SessionContext::new_with_state(state);
//! ```
//! installs the exact INTERSECT/EXCEPT [ALL] step, the GPU semi/anti join rule
//! and the `setfusion.*` settings (`SET setfusion.enabled = false`, ...).

pub mod algo;
pub mod bench;
pub mod cli;
pub mod config;
pub mod datagen;
#[cfg(feature = "ballista")]
pub mod distributed;
pub mod env;
pub mod exec;
pub mod fuzz;
pub mod gpu;
pub mod keys;
pub mod planner;
pub mod scan;
pub mod slt;
pub mod udf;
pub mod util;

use std::sync::Arc;

use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::prelude::{SessionConfig, SessionContext};

pub use config::SetfusionConfig;

/// Add setfusion to a session builder (call after `with_default_features()`).
/// Starts the configured device in the background (no-op without a driver or
/// with `SETFUSION_DISABLE_GPU=1`).
pub fn install(builder: SessionStateBuilder) -> SessionStateBuilder {
    let mut builder = builder;
    let config = builder.config().get_or_insert_with(SessionConfig::new).clone();
    let config = if config.options().extensions.get::<SetfusionConfig>().is_some() {
        config
    } else {
        config.with_option_extension(SetfusionConfig::default())
    };
    // The device starts now, in the background, while the caller registers
    // tables, plans and scans (issue 13); planning never waits for it.
    if let Some(cfg) = config.options().extensions.get::<SetfusionConfig>() {
        if cfg.enabled {
            gpu::start_in_background(cfg.device, &algo::SET_SELECTION_KERNELS);
        }
    }
    // Similarity and tokenizer functions (issue 4), added to whatever is registered.
    builder.scalar_functions().get_or_insert_with(Vec::new).extend(udf::functions());
    // Multiset aggregate (issue 15).
    builder.aggregate_functions().get_or_insert_with(Vec::new).extend(udf::aggregate_functions());
    // intersect_families (issue 15, seed 000).
    builder.table_functions().get_or_insert_with(Default::default).insert(
        udf::families::NAME.to_string(),
        Arc::new(datafusion::catalog::TableFunction::new(udf::families::NAME.to_string(), Arc::new(udf::families::IntersectFamilies))),
    );
    // The semi/anti join rule runs right after DataFusion's join selection and
    // before distribution enforcement: a replaced join then gets no hash
    // repartitioning of its inputs (the operator reads all of them at once).
    let mut rules = PhysicalOptimizer::new().rules;
    let at = rules.iter().position(|r| r.name() == "join_selection").map_or(rules.len(), |i| i + 1);
    rules.insert(at, Arc::new(planner::SemiJoinRule));
    rules.push(Arc::new(planner::SimilarityJoinRule));
    // Last: Parquet inputs of the set selections read by the device (the plan's shape is final).
    rules.push(Arc::new(planner::DeviceScanRule));
    builder
        .with_config(config)
        .with_analyzer_rule(Arc::new(planner::SetOpRule))
        .with_analyzer_rule(Arc::new(planner::MarkJoinRule))
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
/// layer or below, `gpu` < `keys` < `algo` < `exec` < `planner` / `udf` <
/// `cli` / `bench` / `slt` / `fuzz` / `distributed`; `env`, `util` and `config` are usable by
/// every layer. Checked on the source text: each `crate::<module>` path.
#[cfg(test)]
mod layering {
    fn rank(module: &str) -> Option<u32> {
        Some(match module {
            "env" | "util" | "config" | "datagen" => 0,
            "gpu" => 1,
            "keys" | "scan" => 2,
            "algo" => 3,
            "exec" => 4,
            "planner" | "udf" => 5,
            "cli" | "bench" | "slt" | "fuzz" | "distributed" => 6,
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
                    let name: String = code[at + 7..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    if rank(&name).is_some_and(|r| r > own_rank) {
                        upward.push(format!("{rel}:{}: {own} uses crate::{name}", n + 1));
                    }
                }
            }
        }
        assert!(upward.is_empty(), "imports from a lower layer to a higher one:\n{}", upward.join("\n"));
    }
}
