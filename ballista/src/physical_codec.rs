//! [`SetfusionPhysicalCodec`]: setfusion's operators on the wire between
//! Ballista's scheduler and its executors.
//!
//! Each operator is written as its own parameters (ops, keys, filters,
//! strategies, projections); its children travel as the framework's own
//! plan nodes. Expressions go through datafusion-proto's converter, so a
//! setfusion UDF inside a key or filter is encoded by name and found in the
//! executor's function registry. Anything that is not a setfusion operator is
//! handed to the wrapped codec (Ballista's: shuffle readers and writers).

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::common::JoinSide;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{AggregateUDF, ScalarUDF};
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{
    PhysicalExtensionCodec, PhysicalPlanDecodeContext, PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf::{self as proto, PhysicalExprNode};
use prost::Message;

use super::bad;
use setfusion::algo::select::SetOp;
use setfusion::algo::ssjoin::{Metric, Threshold};
use setfusion::config::Strategy;
use setfusion::exec::common::{Decision, NullMode, Reason, Unit};
use setfusion::exec::declined::SetfusionDeclinedExec;
use setfusion::exec::families::{FamiliesExec, Layout, Level};
use setfusion::exec::mark_join::{MarkJoinExec, MarkKind, MarkOutput};
use setfusion::exec::pair_filter::PairFilter;
use setfusion::exec::set_select::SetSelectExec;
use setfusion::exec::similarity_join::SimilarityJoinExec;

/// Marks a setfusion node's bytes, so that decoding tells them from the
/// wrapped codec's without trying to parse them first.
const MAGIC: &[u8] = b"setfusion.exec/1:";

#[derive(Clone, PartialEq, Message)]
struct SetfusionExecNode {
    #[prost(oneof = "ExecNode", tags = "1, 2, 3, 4, 5")]
    node: Option<ExecNode>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum ExecNode {
    #[prost(message, tag = "1")]
    SetSelect(SetSelectNode),
    #[prost(message, tag = "2")]
    MarkJoin(MarkJoinNode),
    #[prost(message, tag = "3")]
    SimilarityJoin(SimilarityJoinNode),
    #[prost(message, tag = "4")]
    Families(FamiliesNode),
    #[prost(message, tag = "5")]
    Declined(DeclinedNode),
}

/// A [`Decision`]: the backend, the GPU strategy and the reason. A CPU
/// decision for want of a device on the planning process (the scheduler;
/// [`Reason::NoGpu`]) becomes the GPU on an executor that has one.
#[derive(Clone, PartialEq, Message)]
struct BackendNode {
    #[prost(bool, tag = "1")]
    gpu: bool,
    #[prost(string, tag = "2")]
    strategy: String,
    #[prost(message, optional, tag = "5")]
    reason: Option<ReasonNode>,
}

/// A [`Reason`]: its kind, and the fields that kind has.
#[derive(Clone, PartialEq, Message)]
struct ReasonNode {
    #[prost(string, tag = "1")]
    kind: String,
    #[prost(string, tag = "2")]
    text: String,
    #[prost(uint64, tag = "3")]
    count: u64,
    #[prost(uint64, tag = "4")]
    min_rows: u64,
    #[prost(string, tag = "5")]
    unit: String,
}

/// An optional list of column indices (absent: no projection).
#[derive(Clone, PartialEq, Message)]
struct Columns {
    #[prost(uint64, repeated, tag = "1")]
    indices: Vec<u64>,
}

#[derive(Clone, PartialEq, Message)]
struct SetSelectNode {
    #[prost(string, tag = "1")]
    op: String,
    #[prost(message, repeated, tag = "2")]
    probe_keys: Vec<PhysicalExprNode>,
    #[prost(message, repeated, tag = "3")]
    build_keys: Vec<PhysicalExprNode>,
    #[prost(string, tag = "4")]
    nulls: String,
    #[prost(message, optional, tag = "5")]
    backend: Option<BackendNode>,
    #[prost(message, optional, tag = "6")]
    projection: Option<Columns>,
    #[prost(bool, tag = "8")]
    partitioned: bool,
}

/// A residual filter over candidate pairs: its expression over `schema`,
/// and where each of the schema's columns comes from.
#[derive(Clone, PartialEq, Message)]
struct PairFilterNode {
    #[prost(message, optional, tag = "1")]
    expr: Option<PhysicalExprNode>,
    /// Per column: from the probe (or left) side?
    #[prost(bool, repeated, tag = "2")]
    from_probe: Vec<bool>,
    #[prost(uint64, repeated, tag = "3")]
    index: Vec<u64>,
    #[prost(message, optional, tag = "4")]
    schema: Option<proto::Schema>,
}

#[derive(Clone, PartialEq, Message)]
struct MarkJoinNode {
    #[prost(string, tag = "1")]
    kind: String,
    #[prost(message, repeated, tag = "2")]
    on_probe: Vec<PhysicalExprNode>,
    #[prost(message, repeated, tag = "3")]
    on_build: Vec<PhysicalExprNode>,
    #[prost(message, optional, tag = "4")]
    in_probe: Option<PhysicalExprNode>,
    #[prost(message, optional, tag = "5")]
    in_build: Option<PhysicalExprNode>,
    #[prost(message, optional, tag = "6")]
    filter: Option<PairFilterNode>,
    #[prost(string, tag = "7")]
    mark_name: String,
    #[prost(string, tag = "8")]
    output: String,
    #[prost(message, optional, tag = "9")]
    backend: Option<BackendNode>,
    #[prost(bool, tag = "11")]
    broadcast_build: bool,
}

#[derive(Clone, PartialEq, Message)]
struct SimilarityJoinNode {
    #[prost(message, optional, tag = "1")]
    left_set: Option<PhysicalExprNode>,
    #[prost(message, optional, tag = "2")]
    right_set: Option<PhysicalExprNode>,
    #[prost(string, tag = "3")]
    metric: String,
    #[prost(double, tag = "4")]
    threshold: f64,
    #[prost(bool, tag = "5")]
    strict: bool,
    #[prost(message, optional, tag = "6")]
    residual: Option<PairFilterNode>,
    #[prost(message, optional, tag = "7")]
    projection: Option<Columns>,
    #[prost(message, optional, tag = "8")]
    backend: Option<BackendNode>,
}

/// A family's layout: `wide` (id, elements list) or long (id, element).
#[derive(Clone, PartialEq, Message)]
struct LayoutNode {
    #[prost(bool, tag = "1")]
    wide: bool,
    #[prost(uint64, tag = "2")]
    id: u64,
    #[prost(uint64, tag = "3")]
    elements: u64,
}

#[derive(Clone, PartialEq, Message)]
struct FamiliesNode {
    #[prost(string, tag = "1")]
    level: String,
    #[prost(message, optional, tag = "2")]
    left_layout: Option<LayoutNode>,
    #[prost(message, optional, tag = "3")]
    right_layout: Option<LayoutNode>,
    #[prost(bool, tag = "4")]
    self_join: bool,
}

#[derive(Clone, PartialEq, Message)]
struct DeclinedNode {
    #[prost(message, optional, tag = "2")]
    reason: Option<ReasonNode>,
}

/// setfusion's [`PhysicalExtensionCodec`], around another one (Ballista's)
/// for every node that is not setfusion's.
pub struct SetfusionPhysicalCodec {
    inner: Arc<dyn PhysicalExtensionCodec>,
}

impl SetfusionPhysicalCodec {
    pub fn new(inner: Arc<dyn PhysicalExtensionCodec>) -> Self {
        Self { inner }
    }
}

impl fmt::Debug for SetfusionPhysicalCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetfusionPhysicalCodec").field("inner", &self.inner).finish()
    }
}

fn required<T>(v: Option<T>, what: &str) -> Result<T> {
    v.ok_or_else(|| bad(format!("{what} is missing")))
}

fn op_name(op: SetOp) -> &'static str {
    match op {
        SetOp::Semi => "semi",
        SetOp::Anti => "anti",
        SetOp::IntersectDistinct => "intersect",
        SetOp::IntersectAll => "intersect_all",
        SetOp::ExceptDistinct => "except",
        SetOp::ExceptAll => "except_all",
    }
}

pub(super) fn parse_op(s: &str) -> Result<SetOp> {
    Ok(match s {
        "semi" => SetOp::Semi,
        "anti" => SetOp::Anti,
        "intersect" => SetOp::IntersectDistinct,
        "intersect_all" => SetOp::IntersectAll,
        "except" => SetOp::ExceptDistinct,
        "except_all" => SetOp::ExceptAll,
        other => return Err(bad(format!("unknown set operation '{other}'"))),
    })
}

pub(super) fn encode_op(op: SetOp) -> String {
    op_name(op).to_string()
}

fn nulls_name(n: NullMode) -> &'static str {
    match n {
        NullMode::NeverEqual => "never_equal",
        NullMode::Equal => "equal",
        NullMode::NullAware => "null_aware",
    }
}

fn parse_nulls(s: &str) -> Result<NullMode> {
    Ok(match s {
        "never_equal" => NullMode::NeverEqual,
        "equal" => NullMode::Equal,
        "null_aware" => NullMode::NullAware,
        other => return Err(bad(format!("unknown NULL mode '{other}'"))),
    })
}

pub(super) fn kind_name(k: MarkKind) -> &'static str {
    match k {
        MarkKind::In => "in",
        MarkKind::Exists => "exists",
    }
}

pub(super) fn parse_kind(s: &str) -> Result<MarkKind> {
    match s {
        "in" => Ok(MarkKind::In),
        "exists" => Ok(MarkKind::Exists),
        other => Err(bad(format!("unknown mark kind '{other}'"))),
    }
}

fn output_name(o: MarkOutput) -> &'static str {
    match o {
        MarkOutput::Mark => "mark",
        MarkOutput::Semi => "semi",
        MarkOutput::Anti => "anti",
    }
}

fn parse_output(s: &str) -> Result<MarkOutput> {
    Ok(match s {
        "mark" => MarkOutput::Mark,
        "semi" => MarkOutput::Semi,
        "anti" => MarkOutput::Anti,
        other => return Err(bad(format!("unknown mark join output '{other}'"))),
    })
}

fn encode_backend(d: &Decision) -> BackendNode {
    BackendNode { gpu: d.on_gpu(), strategy: d.strategy.to_string(), reason: Some(encode_reason(&d.reason)) }
}

/// The decision a decoded operator runs with. The plan's, except that a CPU
/// decision made only for want of a device on the planning process becomes
/// the GPU where this process (an executor) has one and the settings allow it.
fn decode_backend(b: Option<BackendNode>, ctx: &TaskContext) -> Result<Decision> {
    let b = required(b, "backend")?;
    let reason = decode_reason(required(b.reason, "reason")?)?;
    if b.gpu {
        return Ok(Decision::gpu(b.strategy.parse::<Strategy>()?, reason));
    }
    let cfg = setfusion::config::SetfusionConfig::from_options(ctx.session_config().options());
    if matches!(reason, Reason::NoGpu(_))
        && cfg.enabled
        && cfg.strategy != Strategy::Cpu
        && setfusion::gpu::available(cfg.device).is_ok()
    {
        return Ok(Decision::gpu(cfg.strategy, Reason::DeviceOnExecutor));
    }
    Ok(Decision::cpu(reason))
}

fn unit_name(u: Unit) -> &'static str {
    match u {
        Unit::Rows => "rows",
        Unit::Pairs => "pairs",
        Unit::ListElements => "list_elements",
    }
}

fn encode_reason(r: &Reason) -> ReasonNode {
    let node = |kind: &str, text: &str| ReasonNode { kind: kind.into(), text: text.into(), ..Default::default() };
    match r {
        Reason::Disabled => node("disabled", ""),
        Reason::StrategyCpu => node("strategy_cpu", ""),
        Reason::StrategyForced(s) => node("strategy_forced", &s.to_string()),
        Reason::MinRowsZero => node("min_rows_zero", ""),
        Reason::NoGpu(why) => node("no_gpu", why),
        Reason::UnsupportedKeys(why) => node("unsupported_keys", why),
        Reason::BelowMinRows { count, unit, min_rows } | Reason::AtLeastMinRows { count, unit, min_rows } => {
            ReasonNode {
                kind: if matches!(r, Reason::BelowMinRows { .. }) { "below_min_rows" } else { "at_least_min_rows" }
                    .into(),
                text: String::new(),
                count: *count,
                min_rows: *min_rows,
                unit: unit_name(*unit).into(),
            }
        }
        Reason::CostModel(what) => node("cost_model", what),
        Reason::DeviceStarting => node("device_starting", ""),
        Reason::StartsAfterQuery { device, estimate } => ReasonNode {
            kind: "starts_after_query".into(),
            text: estimate.clone(),
            count: *device as u64,
            ..Default::default()
        },
        Reason::HostFilter(why) => node("host_filter", why),
        Reason::DeviceOnExecutor => node("device_on_executor", ""),
        Reason::UnsupportedPredicate(why) => node("unsupported_predicate", why),
        Reason::FloatKeyBounds => node("float_key_bounds", ""),
    }
}

fn decode_reason(n: ReasonNode) -> Result<Reason> {
    let unit = || -> Result<Unit> {
        Ok(match n.unit.as_str() {
            "rows" => Unit::Rows,
            "pairs" => Unit::Pairs,
            "list_elements" => Unit::ListElements,
            other => return Err(bad(format!("unknown unit '{other}'"))),
        })
    };
    Ok(match n.kind.as_str() {
        "disabled" => Reason::Disabled,
        "strategy_cpu" => Reason::StrategyCpu,
        "strategy_forced" => Reason::StrategyForced(n.text.parse::<Strategy>()?),
        "min_rows_zero" => Reason::MinRowsZero,
        "no_gpu" => Reason::NoGpu(n.text),
        "unsupported_keys" => Reason::UnsupportedKeys(n.text),
        "below_min_rows" => Reason::BelowMinRows { count: n.count, unit: unit()?, min_rows: n.min_rows },
        "at_least_min_rows" => Reason::AtLeastMinRows { count: n.count, unit: unit()?, min_rows: n.min_rows },
        "cost_model" => Reason::CostModel(n.text),
        "device_starting" => Reason::DeviceStarting,
        "starts_after_query" => Reason::StartsAfterQuery { device: n.count as usize, estimate: n.text },
        "host_filter" => Reason::HostFilter(n.text),
        "device_on_executor" => Reason::DeviceOnExecutor,
        "unsupported_predicate" => Reason::UnsupportedPredicate(n.text),
        "float_key_bounds" => Reason::FloatKeyBounds,
        other => return Err(bad(format!("unknown reason '{other}'"))),
    })
}

fn encode_columns(p: Option<&[usize]>) -> Option<Columns> {
    p.map(|p| Columns { indices: p.iter().map(|&i| i as u64).collect() })
}

fn decode_columns(c: Option<Columns>) -> Option<Vec<usize>> {
    c.map(|c| c.indices.into_iter().map(|i| i as usize).collect())
}

fn encode_layout(l: Layout) -> LayoutNode {
    match l {
        Layout::Wide { id, elements } => LayoutNode { wide: true, id: id as u64, elements: elements as u64 },
        Layout::Long { id, element } => LayoutNode { wide: false, id: id as u64, elements: element as u64 },
    }
}

fn decode_layout(l: Option<LayoutNode>) -> Result<Layout> {
    let l = required(l, "family layout")?;
    let (id, elements) = (l.id as usize, l.elements as usize);
    Ok(if l.wide { Layout::Wide { id, elements } } else { Layout::Long { id, element: elements } })
}

/// Encoding and decoding of expressions, through the plan's converter and this codec.
struct Exprs<'a> {
    codec: &'a dyn PhysicalExtensionCodec,
    converter: &'a dyn PhysicalProtoConverterExtension,
}

impl Exprs<'_> {
    fn encode(&self, e: &PhysicalExprRef) -> Result<PhysicalExprNode> {
        self.converter.physical_expr_to_proto(e, self.codec)
    }

    fn encode_all<'b>(&self, es: impl IntoIterator<Item = &'b PhysicalExprRef>) -> Result<Vec<PhysicalExprNode>> {
        es.into_iter().map(|e| self.encode(e)).collect()
    }

    fn decode(&self, e: &PhysicalExprNode, schema: &Schema, ctx: &TaskContext) -> Result<PhysicalExprRef> {
        self.converter.proto_to_physical_expr(e, schema, &PhysicalPlanDecodeContext::new(ctx, self.codec))
    }

    fn decode_all(&self, es: &[PhysicalExprNode], schema: &Schema, ctx: &TaskContext) -> Result<Vec<PhysicalExprRef>> {
        es.iter().map(|e| self.decode(e, schema, ctx)).collect()
    }

    fn encode_filter(
        &self,
        expr: &PhysicalExprRef,
        columns: impl Iterator<Item = (bool, usize)>,
        schema: &Schema,
    ) -> Result<PairFilterNode> {
        let (from_probe, index): (Vec<bool>, Vec<u64>) = columns.map(|(p, i)| (p, i as u64)).unzip();
        Ok(PairFilterNode { expr: Some(self.encode(expr)?), from_probe, index, schema: Some(schema.try_into()?) })
    }

    /// A filter's expression, columns and schema.
    fn decode_filter(
        &self,
        f: PairFilterNode,
        ctx: &TaskContext,
    ) -> Result<(PhysicalExprRef, Vec<(bool, usize)>, Arc<Schema>)> {
        let schema: Schema = (&required(f.schema, "filter schema")?).try_into()?;
        if f.from_probe.len() != f.index.len() || f.index.len() != schema.fields().len() {
            return Err(bad("a filter's column list does not match its schema"));
        }
        let expr = self.decode(&required(f.expr, "filter expression")?, &schema, ctx)?;
        let columns = f.from_probe.into_iter().zip(f.index).map(|(p, i)| (p, i as usize)).collect();
        Ok((expr, columns, Arc::new(schema)))
    }
}

fn two_inputs<'a>(
    inputs: &'a [Arc<dyn ExecutionPlan>],
    node: &str,
) -> Result<(&'a Arc<dyn ExecutionPlan>, &'a Arc<dyn ExecutionPlan>)> {
    match inputs {
        [a, b] => Ok((a, b)),
        _ => Err(bad(format!("{node} needs two inputs, got {}", inputs.len()))),
    }
}

impl SetfusionPhysicalCodec {
    /// The message for a setfusion operator; None for any other node.
    fn encode_node(&self, node: &Arc<dyn ExecutionPlan>, exprs: &Exprs) -> Result<Option<ExecNode>> {
        if let Some(e) = node.downcast_ref::<SetSelectExec>() {
            if e.aggregate_above().is_some() {
                // Only the device scan rule absorbs one, over inputs a cluster never gets (its scans).
                return Err(bad("a selection with the aggregate above it absorbed is not sent to executors"));
            }
            return Ok(Some(ExecNode::SetSelect(SetSelectNode {
                op: op_name(e.op()).into(),
                probe_keys: exprs.encode_all(e.probe_keys())?,
                build_keys: exprs.encode_all(e.build_keys())?,
                nulls: nulls_name(e.nulls()).into(),
                backend: Some(encode_backend(e.decision())),
                projection: encode_columns(e.projection()),
                // What was asked for: decoding decides again from the same keys.
                partitioned: e.partitioned_inputs_requested(),
            })));
        }
        if let Some(e) = node.downcast_ref::<MarkJoinExec>() {
            if e.filter_above().is_some() {
                // Only the device scan rule absorbs one, over inputs a cluster never gets (its scans).
                return Err(bad("a MarkJoinExec with the filter above it absorbed is not sent to executors"));
            }
            let filter = match e.filter() {
                Some(f) => Some(exprs.encode_filter(&f.expr, f.columns.iter().copied(), &f.schema)?),
                None => None,
            };
            return Ok(Some(ExecNode::MarkJoin(MarkJoinNode {
                kind: kind_name(e.kind()).into(),
                on_probe: exprs.encode_all(e.on().iter().map(|(p, _)| p))?,
                on_build: exprs.encode_all(e.on().iter().map(|(_, b)| b))?,
                in_probe: e.in_keys().map(|(p, _)| exprs.encode(p)).transpose()?,
                in_build: e.in_keys().map(|(_, b)| exprs.encode(b)).transpose()?,
                filter,
                mark_name: e.mark_name(),
                output: output_name(e.output()).into(),
                backend: Some(encode_backend(e.decision())),
                broadcast_build: e.broadcast_build(),
            })));
        }
        if let Some(e) = node.downcast_ref::<SimilarityJoinExec>() {
            let (l, r) = e.set_exprs();
            let t = e.threshold();
            let residual = match e.residual() {
                Some(f) => {
                    let columns = f.column_indices().iter().map(|c| (c.side == JoinSide::Left, c.index));
                    Some(exprs.encode_filter(f.expression(), columns, f.schema())?)
                }
                None => None,
            };
            return Ok(Some(ExecNode::SimilarityJoin(SimilarityJoinNode {
                left_set: Some(exprs.encode(l)?),
                right_set: Some(exprs.encode(r)?),
                metric: t.metric.name().into(),
                threshold: t.value,
                strict: t.strict,
                residual,
                projection: encode_columns(e.projection()),
                backend: Some(encode_backend(e.decision())),
            })));
        }
        if let Some(e) = node.downcast_ref::<FamiliesExec>() {
            let (l, r) = e.layouts();
            return Ok(Some(ExecNode::Families(FamiliesNode {
                level: e.level().name().into(),
                left_layout: Some(encode_layout(l)),
                right_layout: Some(encode_layout(r)),
                self_join: e.is_self_join(),
            })));
        }
        if let Some(e) = node.downcast_ref::<SetfusionDeclinedExec>() {
            return Ok(Some(ExecNode::Declined(DeclinedNode { reason: Some(encode_reason(e.reason())) })));
        }
        Ok(None)
    }

    fn decode_node(
        &self,
        node: ExecNode,
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        exprs: &Exprs,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(match node {
            ExecNode::SetSelect(n) => {
                let (probe, build) = two_inputs(inputs, "SetSelectExec")?;
                let probe_keys = exprs.decode_all(&n.probe_keys, &probe.schema(), ctx)?;
                let build_keys = exprs.decode_all(&n.build_keys, &build.schema(), ctx)?;
                let exec = SetSelectExec::try_new(
                    parse_op(&n.op)?,
                    probe.clone(),
                    build.clone(),
                    probe_keys,
                    build_keys,
                    parse_nulls(&n.nulls)?,
                    decode_backend(n.backend, ctx)?,
                    decode_columns(n.projection),
                )?
                .with_partitioned_inputs(n.partitioned)?;
                Arc::new(exec)
            }
            ExecNode::MarkJoin(n) => {
                let (probe, build) = two_inputs(inputs, "MarkJoinExec")?;
                let (ps, bs) = (probe.schema(), build.schema());
                if n.on_probe.len() != n.on_build.len() {
                    return Err(bad("a mark join's correlation keys are not in pairs"));
                }
                let on = exprs
                    .decode_all(&n.on_probe, &ps, ctx)?
                    .into_iter()
                    .zip(exprs.decode_all(&n.on_build, &bs, ctx)?)
                    .collect();
                let in_keys = match (n.in_probe, n.in_build) {
                    (Some(p), Some(b)) => Some((exprs.decode(&p, &ps, ctx)?, exprs.decode(&b, &bs, ctx)?)),
                    (None, None) => None,
                    _ => return Err(bad("a mark join's IN key has one side only")),
                };
                let filter = match n.filter {
                    Some(f) => {
                        let (expr, columns, schema) = exprs.decode_filter(f, ctx)?;
                        Some(PairFilter { expr, columns, schema })
                    }
                    None => None,
                };
                let exec = MarkJoinExec::try_new(
                    parse_kind(&n.kind)?,
                    probe.clone(),
                    build.clone(),
                    on,
                    in_keys,
                    filter,
                    &n.mark_name,
                    decode_backend(n.backend, ctx)?,
                )?
                .with_output(parse_output(&n.output)?)?
                .with_broadcast_build(n.broadcast_build);
                Arc::new(exec)
            }
            ExecNode::SimilarityJoin(n) => {
                let (left, right) = two_inputs(inputs, "SimilarityJoinExec")?;
                let left_set = exprs.decode(&required(n.left_set, "left set expression")?, &left.schema(), ctx)?;
                let right_set = exprs.decode(&required(n.right_set, "right set expression")?, &right.schema(), ctx)?;
                let metric = Metric::from_name(&n.metric)
                    .ok_or_else(|| bad(format!("unknown similarity metric '{}'", n.metric)))?;
                let threshold = Threshold { metric, value: n.threshold, strict: n.strict };
                let residual = match n.residual {
                    Some(f) => {
                        let (expr, columns, schema) = exprs.decode_filter(f, ctx)?;
                        let columns = columns
                            .into_iter()
                            .map(|(left, index)| ColumnIndex {
                                index,
                                side: if left { JoinSide::Left } else { JoinSide::Right },
                            })
                            .collect();
                        Some(JoinFilter::new(expr, columns, schema))
                    }
                    None => None,
                };
                let exec = SimilarityJoinExec::try_new(
                    left.clone(),
                    right.clone(),
                    left_set,
                    right_set,
                    threshold,
                    residual,
                    decode_columns(n.projection),
                    decode_backend(n.backend, ctx)?,
                )?;
                Arc::new(exec)
            }
            ExecNode::Families(n) => {
                let level = Level::parse(&n.level)?;
                let (left, right) = match (inputs, n.self_join) {
                    ([left], true) => (left.clone(), None),
                    ([left, right], false) => (left.clone(), Some(right.clone())),
                    _ => return Err(bad(format!("FamiliesExec got {} inputs", inputs.len()))),
                };
                let (ll, rl) = (decode_layout(n.left_layout)?, decode_layout(n.right_layout)?);
                check_layout(ll, &left.schema())?;
                check_layout(rl, &right.as_ref().unwrap_or(&left).schema())?;
                Arc::new(FamiliesExec::try_new(left, right, ll, rl, level)?)
            }
            ExecNode::Declined(n) => match inputs {
                [input] => {
                    Arc::new(SetfusionDeclinedExec::new(input.clone(), decode_reason(required(n.reason, "reason")?)?))
                }
                _ => return Err(bad(format!("SetfusionDeclinedExec needs one input, got {}", inputs.len()))),
            },
        })
    }
}

/// A decoded layout's columns exist in its input (the operator indexes them without checking).
fn check_layout(l: Layout, schema: &Schema) -> Result<()> {
    let (id, elements) = match l {
        Layout::Wide { id, elements } => (id, elements),
        Layout::Long { id, element } => (id, element),
    };
    let n = schema.fields().len();
    if id >= n || elements >= n {
        return Err(bad(format!("a family layout names column {} of an input with {n}", id.max(elements))));
    }
    Ok(())
}

impl PhysicalExtensionCodec for SetfusionPhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(body) = buf.strip_prefix(MAGIC) else {
            return self.inner.try_decode(buf, inputs, ctx, proto_converter);
        };
        let message =
            SetfusionExecNode::decode(body).map_err(|e| bad(format!("cannot decode a setfusion operator: {e}")))?;
        let node = required(message.node, "operator")?;
        self.decode_node(node, inputs, ctx, &Exprs { codec: self, converter: proto_converter })
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        match self.encode_node(&node, &Exprs { codec: self, converter: proto_converter })? {
            Some(n) => {
                buf.extend_from_slice(MAGIC);
                SetfusionExecNode { node: Some(n) }
                    .encode(buf)
                    .map_err(|e| bad(format!("cannot encode a setfusion operator: {e}")))
            }
            None => self.inner.try_encode(node, buf, proto_converter),
        }
    }

    /// setfusion's functions travel by name; an executor without them in its
    /// registry still finds them here.
    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        super::decode_udf(name, || self.inner.try_decode_udf(name, buf))
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        super::encode_udf(node.name(), || self.inner.try_encode_udf(node, buf))
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> Result<Arc<AggregateUDF>> {
        super::decode_udaf(name, || self.inner.try_decode_udaf(name, buf))
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> Result<()> {
        super::encode_udaf(node.name(), || self.inner.try_encode_udaf(node, buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of reason, and both backends, survive the wire.
    #[test]
    fn decisions_round_trip() {
        let task = setfusion::context().task_ctx();
        let reasons = [
            Reason::Disabled,
            Reason::StrategyCpu,
            Reason::StrategyForced(Strategy::Bitmap),
            Reason::MinRowsZero,
            Reason::UnsupportedKeys("key type X".into()),
            Reason::BelowMinRows { count: 3, unit: Unit::Pairs, min_rows: 9 },
            Reason::AtLeastMinRows { count: 30, unit: Unit::ListElements, min_rows: 9 },
            Reason::CostModel("~1 rows".into()),
            Reason::DeviceStarting,
            Reason::StartsAfterQuery { device: 1, estimate: "~2 rows".into() },
            Reason::HostFilter("a UDF".into()),
            Reason::DeviceOnExecutor,
            Reason::UnsupportedPredicate("every pair passes".into()),
            Reason::FloatKeyBounds,
        ];
        for r in reasons {
            assert_eq!(decode_reason(encode_reason(&r)).unwrap(), r);
            for d in [Decision::cpu(r.clone()), Decision::gpu(Strategy::Sort, r.clone())] {
                assert_eq!(decode_backend(Some(encode_backend(&d)), &task).unwrap(), d);
            }
        }
    }

    /// A CPU choice the scheduler made for want of a device becomes the GPU
    /// on an executor that has one (run for real on the GPU machine, where the
    /// test process is that executor); any other CPU choice stays.
    #[test]
    fn a_plan_made_without_a_device_takes_the_executors() {
        let gpu = setfusion::gpu::test_gpu();
        let task = setfusion::context().task_ctx();
        let no_gpu = Decision::cpu(Reason::NoGpu("no CUDA driver".into()));
        let node = |d: &Decision| encode_backend(d);
        let decoded = decode_backend(Some(node(&no_gpu)), &task).unwrap();
        match (&gpu, &decoded) {
            (Some(_), d) if d.on_gpu() && d.reason == Reason::DeviceOnExecutor => {}
            (None, d) if *d == no_gpu => {}
            _ => panic!("planned without a device, device here: {}; decoded {decoded:?}", gpu.is_some()),
        }
        let min_rows = Decision::cpu(Reason::BelowMinRows { count: 12, unit: Unit::Rows, min_rows: 100_000 });
        assert_eq!(decode_backend(Some(node(&min_rows)), &task).unwrap(), min_rows);
        let strategy_cpu = setfusion::context();
        strategy_cpu
            .state_ref()
            .write()
            .config_mut()
            .options_mut()
            .extensions
            .get_mut::<setfusion::config::SetfusionConfig>()
            .unwrap()
            .strategy = Strategy::Cpu;
        assert!(
            !decode_backend(Some(node(&no_gpu)), &strategy_cpu.task_ctx()).unwrap().on_gpu(),
            "strategy cpu keeps the CPU"
        );
    }
}
