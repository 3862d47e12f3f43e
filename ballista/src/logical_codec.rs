//! [`SetfusionLogicalCodec`]: setfusion's logical nodes and its table
//! function's tables on the wire from a Ballista client to the scheduler.
//!
//! The client plans SQL (setfusion's analyzer rules put in [`SetOpNode`] and
//! [`MarkJoinNode`]) and sends the optimized logical plan; the scheduler
//! plans it physically with setfusion's planner. A node is written as its
//! expressions (datafusion-proto's logical expressions) and kind; its inputs
//! travel as the framework's own plan nodes. An `intersect_families(...)`
//! table travels as the scans of its tables (Parquet, CSV, ... as Ballista
//! encodes them) and its level. Everything else goes to the wrapped codec.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::{Column, TableReference};
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{AggregateUDF, Expr, Extension, LogicalPlan, LogicalPlanBuilder, ScalarUDF};
use datafusion_proto::logical_plan::from_proto::{parse_expr, parse_exprs};
use datafusion_proto::logical_plan::to_proto::{serialize_expr, serialize_exprs};
use datafusion_proto::logical_plan::{AsLogicalPlan, LogicalExtensionCodec};
use datafusion_proto::protobuf::{LogicalExprNode, LogicalPlanNode};
use prost::Message;

use setfusion::exec::families::Level;
use setfusion::planner::{MarkJoinNode, SetOpNode};
use setfusion::udf::families::FamiliesTable;

use super::bad;
use super::physical_codec::{encode_op, kind_name, parse_kind, parse_op};

/// Marks setfusion's bytes (nodes and tables), as in the physical codec.
const MAGIC: &[u8] = b"setfusion.plan/1:";

#[derive(Clone, PartialEq, Message)]
struct SetfusionLogicalNode {
    #[prost(oneof = "LogicalNode", tags = "1, 2")]
    node: Option<LogicalNode>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum LogicalNode {
    #[prost(message, tag = "1")]
    SetOp(SetOpMessage),
    #[prost(message, tag = "2")]
    MarkJoin(MarkJoinMessage),
}

#[derive(Clone, PartialEq, Message)]
struct SetOpMessage {
    #[prost(string, tag = "1")]
    op: String,
    #[prost(message, repeated, tag = "2")]
    left_keys: Vec<LogicalExprNode>,
    #[prost(message, repeated, tag = "3")]
    right_keys: Vec<LogicalExprNode>,
}

#[derive(Clone, PartialEq, Message)]
struct MarkJoinMessage {
    #[prost(string, tag = "1")]
    kind: String,
    #[prost(message, repeated, tag = "2")]
    on_probe: Vec<LogicalExprNode>,
    #[prost(message, repeated, tag = "3")]
    on_build: Vec<LogicalExprNode>,
    #[prost(message, optional, tag = "4")]
    in_probe: Option<LogicalExprNode>,
    #[prost(message, optional, tag = "5")]
    in_build: Option<LogicalExprNode>,
    #[prost(message, optional, tag = "6")]
    filter: Option<LogicalExprNode>,
    /// The mark column, as a column expression (its qualifier included).
    #[prost(message, optional, tag = "7")]
    mark: Option<LogicalExprNode>,
}

/// An `intersect_families` table: its level and its tables, each as a scan plan.
#[derive(Clone, PartialEq, Message)]
struct FamiliesTableMessage {
    #[prost(string, tag = "1")]
    level: String,
    #[prost(string, repeated, tag = "2")]
    names: Vec<String>,
    /// Encoded `LogicalPlanNode`s, one table scan per name.
    #[prost(bytes = "vec", repeated, tag = "3")]
    scans: Vec<Vec<u8>>,
}

/// setfusion's [`LogicalExtensionCodec`], around another one (Ballista's).
pub struct SetfusionLogicalCodec {
    inner: Arc<dyn LogicalExtensionCodec>,
}

impl SetfusionLogicalCodec {
    pub fn new(inner: Arc<dyn LogicalExtensionCodec>) -> Self {
        Self { inner }
    }
}

impl fmt::Debug for SetfusionLogicalCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetfusionLogicalCodec").field("inner", &self.inner).finish()
    }
}

fn two_inputs(inputs: &[LogicalPlan], node: &str) -> Result<(LogicalPlan, LogicalPlan)> {
    match inputs {
        [a, b] => Ok((a.clone(), b.clone())),
        _ => Err(bad(format!("{node} needs two inputs, got {}", inputs.len()))),
    }
}

impl SetfusionLogicalCodec {
    fn encode_node(&self, node: &Extension) -> Result<Option<LogicalNode>> {
        let any = node.node.as_any();
        if let Some(n) = any.downcast_ref::<SetOpNode>() {
            return Ok(Some(LogicalNode::SetOp(SetOpMessage {
                op: encode_op(n.op),
                left_keys: serialize_exprs(&n.left_keys, self)?,
                right_keys: serialize_exprs(&n.right_keys, self)?,
            })));
        }
        if let Some(n) = any.downcast_ref::<MarkJoinNode>() {
            let one = |e: &Expr| serialize_expr(e, self);
            return Ok(Some(LogicalNode::MarkJoin(MarkJoinMessage {
                kind: kind_name(n.kind).into(),
                on_probe: serialize_exprs(n.on.iter().map(|(p, _)| p), self)?,
                on_build: serialize_exprs(n.on.iter().map(|(_, b)| b), self)?,
                in_probe: n.in_keys.as_ref().map(|(p, _)| one(p)).transpose()?,
                in_build: n.in_keys.as_ref().map(|(_, b)| one(b)).transpose()?,
                filter: n.filter.as_ref().map(one).transpose()?,
                mark: Some(one(&Expr::Column(n.mark.clone()))?),
            })));
        }
        Ok(None)
    }

    fn decode_node(&self, node: LogicalNode, inputs: &[LogicalPlan], ctx: &TaskContext) -> Result<Extension> {
        let node: Arc<dyn datafusion::logical_expr::UserDefinedLogicalNode> = match node {
            LogicalNode::SetOp(m) => {
                let (left, right) = two_inputs(inputs, "SetOp")?;
                let left_keys = parse_exprs(&m.left_keys, ctx, self)?;
                let right_keys = parse_exprs(&m.right_keys, ctx, self)?;
                if left_keys.len() != right_keys.len() || left_keys.is_empty() {
                    return Err(bad("a set operation's key lists must be non-empty and of equal length"));
                }
                Arc::new(SetOpNode { op: parse_op(&m.op)?, left, right, left_keys, right_keys })
            }
            LogicalNode::MarkJoin(m) => {
                let (probe, build) = two_inputs(inputs, "MarkJoin")?;
                if m.on_probe.len() != m.on_build.len() {
                    return Err(bad("a mark join's correlation keys are not in pairs"));
                }
                let on = parse_exprs(&m.on_probe, ctx, self)?
                    .into_iter()
                    .zip(parse_exprs(&m.on_build, ctx, self)?)
                    .collect();
                let in_keys = match (&m.in_probe, &m.in_build) {
                    (Some(p), Some(b)) => Some((parse_expr(p, ctx, self)?, parse_expr(b, ctx, self)?)),
                    (None, None) => None,
                    _ => return Err(bad("a mark join's IN key has one side only")),
                };
                let filter = m.filter.as_ref().map(|f| parse_expr(f, ctx, self)).transpose()?;
                let mark: Column = match m.mark.as_ref().map(|e| parse_expr(e, ctx, self)).transpose()? {
                    Some(Expr::Column(c)) => c,
                    _ => return Err(bad("a mark join's mark is not a column")),
                };
                Arc::new(MarkJoinNode::try_new(parse_kind(&m.kind)?, probe, build, on, in_keys, filter, mark)?)
            }
        };
        Ok(Extension { node })
    }
}

impl LogicalExtensionCodec for SetfusionLogicalCodec {
    fn try_decode(&self, buf: &[u8], inputs: &[LogicalPlan], ctx: &TaskContext) -> Result<Extension> {
        let Some(body) = buf.strip_prefix(MAGIC) else {
            return self.inner.try_decode(buf, inputs, ctx);
        };
        let message =
            SetfusionLogicalNode::decode(body).map_err(|e| bad(format!("cannot decode a setfusion node: {e}")))?;
        let node = message.node.ok_or_else(|| bad("a setfusion node is missing"))?;
        self.decode_node(node, inputs, ctx)
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> Result<()> {
        match self.encode_node(node)? {
            Some(n) => {
                buf.extend_from_slice(MAGIC);
                SetfusionLogicalNode { node: Some(n) }
                    .encode(buf)
                    .map_err(|e| bad(format!("cannot encode a setfusion node: {e}")))
            }
            None => self.inner.try_encode(node, buf),
        }
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        let Some(body) = buf.strip_prefix(MAGIC) else {
            return self.inner.try_decode_table_provider(buf, table_ref, schema, ctx);
        };
        let m = FamiliesTableMessage::decode(body)
            .map_err(|e| bad(format!("cannot decode an intersect_families table: {e}")))?;
        let tables = m
            .scans
            .iter()
            .map(|bytes| {
                let node = LogicalPlanNode::decode(bytes.as_slice())
                    .map_err(|e| bad(format!("cannot decode a family's table: {e}")))?;
                match node.try_into_logical_plan(ctx, self)? {
                    LogicalPlan::TableScan(scan) => source_as_provider(&scan.source),
                    _ => Err(bad("a family's table is not a table scan")),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let table = FamiliesTable::try_from_tables(m.names, tables, Level::parse(&m.level)?)?;
        if table.schema() != schema {
            return Err(bad(format!("the intersect_families table {table_ref} decodes with another schema")));
        }
        Ok(Arc::new(table))
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        let Some(table) = node.downcast_ref::<FamiliesTable>() else {
            return self.inner.try_encode_table_provider(table_ref, node, buf);
        };
        let mut names = Vec::new();
        let mut scans = Vec::new();
        for (name, provider) in table.tables() {
            let scan = LogicalPlanBuilder::scan(name, provider_as_source(provider.clone()), None)?.build()?;
            scans.push(LogicalPlanNode::try_from_logical_plan(&scan, self)?.encode_to_vec());
            names.push(name.to_string());
        }
        buf.extend_from_slice(MAGIC);
        FamiliesTableMessage { level: table.level().name().into(), names, scans }
            .encode(buf)
            .map_err(|e| bad(format!("cannot encode an intersect_families table: {e}")))
    }

    /// setfusion's functions travel by name (the scheduler's registry has them too).
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
