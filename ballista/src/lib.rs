//! setfusion on an Apache DataFusion Ballista cluster (issue 17).
//!
//! A Ballista client plans SQL into a logical plan and sends it to the
//! scheduler, which plans it physically, splits it into stages at each
//! shuffle and sends each stage's tasks to the executors. Every one of them
//! must know setfusion: the client and the scheduler its logical nodes
//! ([`SetfusionLogicalCodec`]), its functions and analyzer rules; the
//! scheduler its physical planner and rules; the executors its operators
//! ([`SetfusionPhysicalCodec`]) and functions; all of them the `setfusion.*`
//! settings. [`install_ballista`] does that for a session, [`session_builder`]
//! / [`ballista_config`] / [`codec`] are the pieces a scheduler and an
//! executor process take ([`scheduler_config`], [`executor_config`]).
//!
//! Distribution: under [`ballista_config`] the set operations and semi / anti
//! joins ask for both inputs hash-partitioned on their keys
//! (`setfusion.hash_partition_inputs`), so Ballista shuffles both sides by key
//! and each task decides one partition where its rows meet; see the README's
//! "On a Ballista cluster" section for every operator.
//!
//! Devices: an operator runs on the executor's GPU when the executor has one
//! and on the CPU otherwise (the GPU backend falls back to its CPU twin; a
//! plan made on a scheduler without a device takes the executor's device,
//! see `physical_codec::decode_backend`).

pub mod demo;
mod logical_codec;
mod physical_codec;
pub mod process;

use std::sync::Arc;

use ballista_core::extension::SessionConfigExt;
use ballista_core::serde::{BallistaCodec, BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::error::Result;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::{AggregateUDF, ScalarUDF};
use datafusion::prelude::SessionConfig;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::PhysicalExtensionCodec;

use setfusion::config::SetfusionConfig;

pub use logical_codec::SetfusionLogicalCodec;
pub use physical_codec::SetfusionPhysicalCodec;

/// setfusion's scalar function called `name` (or aliased so), if any.
pub fn scalar_function(name: &str) -> Option<Arc<ScalarUDF>> {
    setfusion::udf::functions().into_iter().find(|f| f.name() == name || f.aliases().iter().any(|a| a == name))
}

/// setfusion's aggregate function called `name` (or aliased so), if any.
pub fn aggregate_function(name: &str) -> Option<Arc<AggregateUDF>> {
    setfusion::udf::aggregate_functions()
        .into_iter()
        .find(|f| f.name() == name || f.aliases().iter().any(|a| a == name))
}

/// Both codecs' error for bytes they cannot decode or a node they cannot encode.
fn bad(what: impl std::fmt::Display) -> datafusion::error::DataFusionError {
    datafusion::error::DataFusionError::Internal(format!("setfusion codec: {what}"))
}

/// Both codecs' function decoding: setfusion's scalar function called `name`
/// (its functions carry no state, so the name is all that travels), else `other`'s.
fn decode_udf(name: &str, other: impl FnOnce() -> Result<Arc<ScalarUDF>>) -> Result<Arc<ScalarUDF>> {
    scalar_function(name).map_or_else(other, Ok)
}

/// Both codecs' function encoding: nothing for setfusion's scalar functions, else `other`.
fn encode_udf(name: &str, other: impl FnOnce() -> Result<()>) -> Result<()> {
    scalar_function(name).map_or_else(other, |_| Ok(()))
}

/// [`decode_udf`] for aggregate functions. The session's settings that
/// `set_intersect_agg` carries after analysis do not travel: an executor
/// decodes the function with the default settings.
fn decode_udaf(name: &str, other: impl FnOnce() -> Result<Arc<AggregateUDF>>) -> Result<Arc<AggregateUDF>> {
    aggregate_function(name).map_or_else(other, Ok)
}

/// [`encode_udf`] for aggregate functions.
fn encode_udaf(name: &str, other: impl FnOnce() -> Result<()>) -> Result<()> {
    aggregate_function(name).map_or_else(other, |_| Ok(()))
}

/// setfusion's logical codec around Ballista's.
pub fn logical_codec() -> Arc<dyn LogicalExtensionCodec> {
    Arc::new(SetfusionLogicalCodec::new(Arc::new(BallistaLogicalExtensionCodec::default())))
}

/// setfusion's physical codec around Ballista's.
pub fn physical_codec() -> Arc<dyn PhysicalExtensionCodec> {
    Arc::new(SetfusionPhysicalCodec::new(Arc::new(BallistaPhysicalExtensionCodec::default())))
}

/// Both codecs, as Ballista's scheduler and executor take them.
pub fn codec() -> BallistaCodec {
    BallistaCodec::new(logical_codec(), physical_codec())
}

/// `config` made ready for Ballista and setfusion: Ballista's settings,
/// setfusion's codecs, and the `setfusion.*` settings (inputs hash-partitioned
/// by default; settings already present are kept, so a client's `SET`
/// reaches the scheduler and the executors unchanged). Ballista's adaptive
/// planner is turned off (`ballista.planner.adaptive.enabled = false`): it
/// does not run the session's physical rules.
pub fn ballista_config(config: SessionConfig) -> SessionConfig {
    let mut config = config.upgrade_for_ballista();
    if config.options().extensions.get::<SetfusionConfig>().is_none() {
        let settings = SetfusionConfig { hash_partition_inputs: true, ..SetfusionConfig::default() };
        // Ballista's adaptive planner (on by default) optimizes with its own fixed list of
        // physical rules instead of the session's, so setfusion's semi / anti join and
        // similarity join rules would never run on the cluster; its static planner uses the
        // session's rules.
        config = config
            .with_option_extension(settings)
            .set_bool(ballista_core::config::BALLISTA_ADAPTIVE_PLANNER_ENABLED, false);
    }
    config
        .with_ballista_logical_extension_codec(logical_codec())
        .with_ballista_physical_extension_codec(physical_codec())
}

/// [`setfusion::install`] for Ballista: setfusion's functions, rules, planner and
/// settings, with [`ballista_config`]'s codecs and distribution. A client
/// passes the built state to `SessionContext::remote_with_state`; an
/// executor takes its functions (`(&state).into()`).
pub fn install_ballista(builder: SessionStateBuilder) -> SessionStateBuilder {
    let mut builder = builder;
    let config = builder.config().get_or_insert_with(SessionConfig::new).clone();
    setfusion::install(builder.with_config(ballista_config(config)))
}

/// The scheduler's session for a client's settings: Ballista's default
/// session with setfusion installed (`SchedulerConfig::override_session_builder`).
pub fn session_builder(config: SessionConfig) -> Result<SessionState> {
    let state = ballista_core::utils::default_session_builder(ballista_config(config))?;
    Ok(setfusion::install(SessionStateBuilder::new_from_existing(state)).build())
}

/// A scheduler process's configuration made setfusion-aware: its sessions
/// ([`session_builder`]), its default settings and its codecs.
pub fn scheduler_config(
    config: ballista_scheduler::config::SchedulerConfig,
) -> ballista_scheduler::config::SchedulerConfig {
    let mut config = config
        .with_override_session_builder(Arc::new(session_builder))
        .with_override_config_producer(Arc::new(|| ballista_config(SessionConfig::new_with_ballista())));
    config.override_logical_codec = Some(logical_codec());
    config.override_physical_codec = Some(physical_codec());
    config
}

/// An executor process's configuration made setfusion-aware: its settings,
/// its function registry and its codecs.
pub fn executor_config(
    config: ballista_executor::executor_process::ExecutorProcessConfig,
) -> ballista_executor::executor_process::ExecutorProcessConfig {
    let mut config = config;
    let state = install_ballista(SessionStateBuilder::new().with_default_features()).build();
    config.override_function_registry = Some(Arc::new((&state).into()));
    config.override_config_producer = Some(Arc::new(|| ballista_config(SessionConfig::new_with_ballista())));
    config.override_logical_codec = Some(logical_codec());
    config.override_physical_codec = Some(physical_codec());
    config
}

/// An in-process cluster on loopback ports: a scheduler and `executors`
/// executors (`concurrent_tasks` task slots each), for the example, the test
/// and the benchmark. Returns the scheduler's URL for `SessionContext::remote_with_state`.
pub async fn start_loopback_cluster(executors: usize, concurrent_tasks: usize) -> Result<String> {
    use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
    let config_producer: ballista_core::ConfigProducer =
        Arc::new(|| ballista_config(SessionConfig::new_with_ballista()));
    let addr = ballista_scheduler::standalone::new_standalone_scheduler_with_builder(
        Arc::new(session_builder),
        config_producer.clone(),
        codec(),
    )
    .await
    .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
    let url = format!("http://localhost:{}", addr.port());
    // The scheduler serves from a spawned task: wait until it answers.
    let scheduler = loop {
        match SchedulerGrpcClient::connect(url.clone()).await {
            Ok(client) => break client,
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    };
    let state = install_ballista(SessionStateBuilder::new().with_default_features()).build();
    for _ in 0..executors {
        let runtime = state.runtime_env().clone();
        let runtime_producer: ballista_core::RuntimeProducer = Arc::new(move |_: &SessionConfig| Ok(runtime.clone()));
        ballista_executor::new_standalone_executor_from_builder(
            scheduler.clone(),
            concurrent_tasks,
            config_producer.clone(),
            runtime_producer,
            codec(),
            (&state).into(),
        )
        .await
        .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
    }
    Ok(url)
}

/// A client session for the scheduler at `url`, with setfusion installed
/// (the same settings as a single-process `setfusion::context_with_config(config)`).
pub async fn remote_context(url: &str, config: SessionConfig) -> Result<datafusion::prelude::SessionContext> {
    use ballista::prelude::SessionContextExt;
    let state = install_ballista(SessionStateBuilder::new().with_config(config).with_default_features()).build();
    let ctx = datafusion::prelude::SessionContext::remote_with_state(url, state).await?;
    register_functions(&ctx);
    Ok(ctx)
}

/// Register setfusion's functions in `ctx` again: `remote_with_state` gives
/// the client Ballista's function lists in place of the session's own.
pub fn register_functions(ctx: &datafusion::prelude::SessionContext) {
    for f in setfusion::udf::functions() {
        ctx.register_udf(f.as_ref().clone());
    }
    for f in setfusion::udf::aggregate_functions() {
        ctx.register_udaf(f.as_ref().clone());
    }
    ctx.register_udtf(setfusion::udf::families::NAME, Arc::new(setfusion::udf::families::IntersectFamilies));
}

#[cfg(test)]
mod tests;
