//! `DeviceScanExec`: a Parquet input of a set selection whose key column the
//! device reads itself ([`crate::scan`]). The node stands where DataFusion's
//! scan subtree stood (a Parquet `DataSourceExec`, optionally under column
//! projections, `FilterExec`s, `CoalesceBatchesExec`, `RepartitionExec` or
//! `CoalescePartitionsExec`), with that subtree's schema and properties.
//!
//! The filters on the way (and the scan's own predicate where the scan
//! applies it to rows, `pushdown_filters`) become one [`ScanFilter`]: a
//! program of `kernels/join_filter.cu` over the file columns it reads, which
//! the device decodes beside the key and runs before taking the keys.
//!
//! A composite key's other columns (exact fixed-width types) are read beside
//! the first; the filter then always exists, its programs testing the key
//! columns for NULL, and the selection packs the kept rows' columns into one
//! 64-bit key on the device (`exec::device_select`).
//!
//! `SetSelectExec` recognises it and takes the keys on the device, with no
//! Arrow batch on the host. Anyone else who executes it gets the original
//! subtree's batches: the node runs that subtree, which it keeps (it is a
//! leaf to the optimizer, so no later rule rewrites what it stands for).
//!
//! [`DeviceScanExec::try_from_input`] decides at planning time, from the plan
//! alone: what it cannot take (a filter the programs cannot express or over
//! a column it does not decode, a type, a remote store, a partition column,
//! ...) comes back as a reason for EXPLAIN. The files themselves are
//! checked when the scan runs (codec, encodings, nested or adapted columns),
//! where an unsupported file sends that input back to the host scan.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::physical_plan::ParquetSource;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CastExpr, Column, DynamicFilterPhysicalExpr, InListExpr, IsNotNullExpr, IsNullExpr, LikeExpr, Literal,
    NotExpr,
};
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};

use super::pair_filter::{compile, PairFilter};
use crate::algo::join_filter::{op, Instr};
use crate::algo::row_hash::LikePattern;
use crate::scan::ScanFile;

/// See the module documentation.
#[derive(Debug)]
pub struct DeviceScanExec {
    /// The subtree this node stands for (run as is by anyone but a set selection).
    input: Arc<dyn ExecutionPlan>,
    files: Vec<ScanFile>,
    /// The key column's name in the files.
    column: String,
    data_type: DataType,
    /// A composite key's other columns (file column, type), in key order:
    /// the device packs the key columns of both inputs into one exact 64-bit
    /// key (`exec::device_select`); such a scan always has a [`ScanFilter`],
    /// whose programs test the key columns for NULL. Empty: one key column.
    more_keys: Vec<(String, DataType)>,
    /// Rows the input's filters remove (None: none).
    filter: Option<ScanFilter>,
    /// The files' schema and the conjunction of the input's filters and the
    /// scan's own predicate over it (dynamic filters aside), for pruning row
    /// groups by their statistics as DataFusion's scan does (None: nothing to prune by).
    prune: Option<(SchemaRef, PhysicalExprRef)>,
    /// Prune by bloom filters too (the scan's `bloom_filter_on_read`, as DataFusion's scan).
    bloom_filters: bool,
    /// Prune pages by the page index too (the scan's `enable_page_index`, as DataFusion's scan).
    page_index: bool,
    /// The input's columns (file column, type), decoded by the device for
    /// the operator's output; None: only the key is read.
    payload: Option<Vec<(String, DataType)>>,
    /// What the last device scan did (or why it went back to the host), for EXPLAIN ANALYZE.
    ran: Arc<Mutex<Option<String>>>,
    /// The baseline metrics of the host batches `execute` passes on; a
    /// device scan read by the set selection outputs no batch (see `ran`).
    metrics: ExecutionPlanMetricsSet,
}

/// The nodes a device scan may stand above, one input: what each does to a column index.
type Chain = Vec<(Arc<dyn ExecutionPlan>, PhysicalExprRef)>;

/// Follow column `index` of `node`'s output down through the nodes a device
/// scan may replace (projections of columns, filters, batch and partition
/// moves) to the first node of another kind: that node and the column's
/// index in its output. Each filter met on the way is pushed to `filters`
/// with the node it reads.
fn follow_down(
    mut node: Arc<dyn ExecutionPlan>,
    mut index: usize,
    mut filters: Option<&mut Chain>,
) -> std::result::Result<(Arc<dyn ExecutionPlan>, usize), String> {
    loop {
        if let Some(p) = node.downcast_ref::<ProjectionExec>() {
            let e = &p.expr()[index];
            let Some(c) = e.expr.downcast_ref::<Column>() else {
                return Err(format!("column {} computed by {}", e.alias, e.expr));
            };
            index = c.index();
            node = p.input().clone();
        } else if let Some(f) = node.downcast_ref::<FilterExec>() {
            if let Some(chain) = filters.as_deref_mut() {
                chain.push((f.input().clone(), f.predicate().clone()));
            }
            if let Some(p) = f.projection() {
                index = *p.get(index).ok_or("filter projection")?;
            }
            node = f.input().clone();
        } else if matches!(node.name(), "CoalesceBatchesExec" | "RepartitionExec" | "CoalescePartitionsExec")
            && node.children().len() == 1
        {
            // They move rows between batches and partitions, never change a value.
            let child = node.children()[0].clone();
            node = child;
        } else {
            return Ok((node, index));
        }
    }
}

/// `expr` with each column replaced by `to` (Err: the first column it refuses, and why).
fn rewrite_columns(
    expr: &PhysicalExprRef,
    mut to: impl FnMut(&Column) -> std::result::Result<Column, String>,
) -> std::result::Result<PhysicalExprRef, String> {
    let mut why = None;
    let rewritten = expr
        .clone()
        .transform(|e| {
            let Some(c) = e.downcast_ref::<Column>() else { return Ok(Transformed::no(e)) };
            match to(c) {
                Ok(new) => Ok(Transformed::yes(Arc::new(new) as PhysicalExprRef)),
                Err(w) => {
                    why.get_or_insert(w);
                    Ok(Transformed::no(e))
                }
            }
        })
        .map_err(|e| e.to_string())?
        .data;
    match why {
        Some(why) => Err(why),
        None => Ok(rewritten),
    }
}

/// A filter the device evaluates on the scanned rows before their keys are
/// taken: the predicates of the `FilterExec`s between the operator and the
/// Parquet scan, and the predicate the scan itself applies to rows (with
/// `pushdown_filters`), over the file columns they read.
#[derive(Debug, Clone)]
pub struct ScanFilter {
    /// The file columns the programs read, in their column order (the key columns last), with their types;
    /// a string column under LIKE once more for each pattern ([`StringPattern`]).
    pub columns: Vec<(String, DataType)>,
    /// Rows kept with a non-NULL key: `filter AND key IS NOT NULL` (each key column's, ANDed).
    pub keep_valid: Vec<Instr>,
    /// Rows kept with a NULL key: `filter AND key IS NULL` (any key column's).
    pub keep_null: Vec<Instr>,
    /// The predicate as DataFusion printed it, for EXPLAIN (empty: none, a
    /// composite key's NULL tests alone).
    pub text: String,
    /// The string columns among `columns`, which the programs read as the
    /// number of the literal each row equals ([`StringLiterals`]).
    pub literals: Vec<StringLiterals>,
    /// The string columns' LIKE patterns, each read as a column of its own.
    pub patterns: Vec<StringPattern>,
}

/// A string column under LIKE (a pattern whose only wildcard is `%`): the
/// programs read column `column` (the string column once more) as 1 where a
/// row matches, 0 where not ([`crate::algo::row_hash::match_like_gpu`]), with
/// the string column's NULLs.
#[derive(Debug, Clone, PartialEq)]
pub struct StringPattern {
    pub column: usize,
    pub pattern: LikePattern,
}

/// A string column of a [`ScanFilter`], compared with literals only (`=`,
/// `<>`, [NOT] IN, IS [NOT] NULL): the programs read it as the number of the
/// literal a row equals (1 + its index here, 0 for none;
/// [`crate::algo::row_hash::match_literals_gpu`], exact on the bytes), with
/// the column's NULLs, and compare that number with the literal's.
#[derive(Debug, Clone, PartialEq)]
pub struct StringLiterals {
    /// Its index in the filter's `columns`.
    pub column: usize,
    pub literals: Vec<Vec<u8>>,
}

/// Composite keys of more columns stay with the host (each column is one packing pass on the device).
const MAX_KEY_COLUMNS: usize = 8;

/// IN lists longer than this stay with DataFusion (each value is one comparison of the program).
const MAX_IN_LIST: usize = 64;

/// Utf8 types: Some(true); binary types: Some(false); others: None. A cast
/// within one family keeps a value's bytes.
fn byte_family(t: &DataType) -> Option<bool> {
    use DataType::*;
    match t {
        Utf8 | LargeUtf8 | Utf8View => Some(true),
        Binary | LargeBinary | BinaryView => Some(false),
        _ => None,
    }
}

/// The string column `e` reads (through casts that keep its bytes), by its index in `columns`.
fn string_column(e: &PhysicalExprRef, columns: &[(String, DataType)]) -> Option<usize> {
    let mut e = e;
    let mut family = None;
    while let Some(c) = e.downcast_ref::<CastExpr>() {
        let to = byte_family(c.cast_type())?;
        if family.is_some_and(|f| f != to) {
            return None;
        }
        family = Some(to);
        e = c.expr();
    }
    let c = e.downcast_ref::<Column>()?;
    let own = byte_family(&columns.get(c.index())?.1)?;
    (family.is_none_or(|f| f == own)).then_some(c.index())
}

/// A string or binary literal's bytes (Some(None): a NULL one).
fn literal_bytes(e: &PhysicalExprRef) -> Option<Option<Vec<u8>>> {
    use datafusion::common::ScalarValue::*;
    let l = e.downcast_ref::<Literal>()?;
    match l.value() {
        Utf8(v) | LargeUtf8(v) | Utf8View(v) => Some(v.as_ref().map(|s| s.as_bytes().to_vec())),
        Binary(v) | LargeBinary(v) | BinaryView(v) => Some(v.clone()),
        _ => None,
    }
}

/// `e` with every comparison of a string column with literals made a
/// comparison of the column's literal number (see [`StringLiterals`]: the
/// column then reads as Int64), every LIKE with a `%`-only pattern a
/// comparison of a column of its own, appended to `columns` (see
/// [`StringPattern`]), and IN lists made ORed equalities (the same under
/// SQL's three-valued logic, NULLs in the list included). Err: a string
/// column used otherwise, which the device cannot evaluate.
fn number_string_literals(
    e: &PhysicalExprRef,
    columns: &mut Vec<(String, DataType)>,
    numbered: &mut Vec<StringLiterals>,
    patterns: &mut Vec<StringPattern>,
) -> std::result::Result<PhysicalExprRef, String> {
    fn col(columns: &[(String, DataType)], c: usize) -> PhysicalExprRef {
        Arc::new(Column::new(&columns[c].0, c))
    }
    if let Some(l) = e.downcast_ref::<LikeExpr>() {
        if let (Some(c), Some(Some(pattern))) = (string_column(l.expr(), columns), literal_bytes(l.pattern())) {
            if l.case_insensitive() {
                return Err(format!("the filter's ILIKE on {}", columns[c].0));
            }
            let Some(pattern) = LikePattern::new(&pattern) else {
                return Err(format!("the filter's LIKE pattern {} (`_` or an escape)", l.pattern()));
            };
            columns.push(columns[c].clone());
            patterns.push(StringPattern { column: columns.len() - 1, pattern });
            let want = Arc::new(Literal::new(datafusion::common::ScalarValue::Int64(Some(!l.negated() as i64))));
            return Ok(Arc::new(BinaryExpr::new(col(columns, columns.len() - 1), Operator::Eq, want)));
        }
    }
    if let Some(b) = e.downcast_ref::<BinaryExpr>() {
        if matches!(b.op(), Operator::Eq | Operator::NotEq) {
            let pair = match (string_column(b.left(), columns), literal_bytes(b.right())) {
                (Some(c), Some(l)) => Some((c, l)),
                _ => string_column(b.right(), columns).zip(literal_bytes(b.left())),
            };
            if let Some((c, lit)) = pair {
                return Ok(Arc::new(BinaryExpr::new(col(columns, c), *b.op(), literal_number(numbered, c, lit))));
            }
        }
    }
    if let Some(l) = e.downcast_ref::<InListExpr>() {
        if l.list().len() > MAX_IN_LIST {
            return Err(format!("an IN list of {} values", l.list().len()));
        }
        let (probe, string) = match string_column(l.expr(), columns) {
            Some(c) => (col(columns, c), Some(c)),
            None => (number_string_literals(l.expr(), columns, numbered, patterns)?, None),
        };
        let mut any: Option<PhysicalExprRef> = None;
        for v in l.list() {
            let value = match string {
                Some(c) => {
                    let lit = literal_bytes(v).ok_or_else(|| format!("{} IN a list holding {v}", l.expr()))?;
                    literal_number(numbered, c, lit)
                }
                None => number_string_literals(v, columns, numbered, patterns)?,
            };
            let eq: PhysicalExprRef = Arc::new(BinaryExpr::new(probe.clone(), Operator::Eq, value));
            any = Some(match any {
                Some(a) => Arc::new(BinaryExpr::new(a, Operator::Or, eq)),
                None => eq,
            });
        }
        let any = any.ok_or("an empty IN list")?;
        return Ok(if l.negated() { Arc::new(NotExpr::new(any)) } else { any });
    }
    if let Some(arg) = e.downcast_ref::<IsNullExpr>().map(|n| n.arg()) {
        if let Some(c) = string_column(arg, columns) {
            column_literals(numbered, c);
            return Ok(Arc::new(IsNullExpr::new(col(columns, c))));
        }
    }
    if let Some(arg) = e.downcast_ref::<IsNotNullExpr>().map(|n| n.arg()) {
        if let Some(c) = string_column(arg, columns) {
            column_literals(numbered, c);
            return Ok(Arc::new(IsNotNullExpr::new(col(columns, c))));
        }
    }
    if let Some((name, t)) = e.downcast_ref::<Column>().and_then(|c| columns.get(c.index())) {
        if byte_family(t).is_some() {
            return Err(format!("the filter reads {name} of type {t} other than =, <>, IN or IS NULL with literals"));
        }
    }
    let children = e.children();
    if children.is_empty() {
        return Ok(e.clone());
    }
    let children = children
        .into_iter()
        .map(|c| number_string_literals(c, columns, numbered, patterns))
        .collect::<std::result::Result<_, _>>()?;
    e.clone().with_new_children(children).map_err(|e| e.to_string())
}

/// Column `c`'s literals among the numbered string columns (an entry without literals added if new).
fn column_literals(numbered: &mut Vec<StringLiterals>, c: usize) -> &mut Vec<Vec<u8>> {
    let at = match numbered.iter().position(|s| s.column == c) {
        Some(at) => at,
        None => {
            numbered.push(StringLiterals { column: c, literals: Vec::new() });
            numbered.len() - 1
        }
    };
    &mut numbered[at].literals
}

/// The number string column `c` reads as where it equals `lit` (numbered
/// here if new; a NULL literal: a NULL number).
fn literal_number(numbered: &mut Vec<StringLiterals>, c: usize, lit: Option<Vec<u8>>) -> PhysicalExprRef {
    let literals = column_literals(numbered, c);
    let n = lit.map(|lit| {
        1 + literals.iter().position(|x| *x == lit).unwrap_or_else(|| {
            literals.push(lit);
            literals.len() - 1
        }) as i64
    });
    Arc::new(Literal::new(datafusion::common::ScalarValue::Int64(n)))
}

impl ScanFilter {
    /// Compile `predicates` (each over the file columns `columns`, by index)
    /// for the device; Err: why the device cannot evaluate them. `keys`: the
    /// key columns, appended to `columns` (a row's key is NULL where any of
    /// them is). None: no predicate and one key column (nothing to run).
    fn compile(
        predicates: Vec<PhysicalExprRef>,
        mut columns: Vec<(String, DataType)>,
        keys: &[(&str, &DataType)],
    ) -> std::result::Result<Option<Self>, String> {
        let expr = predicates.into_iter().reduce(|a, b| Arc::new(BinaryExpr::new(a, Operator::And, b)) as _);
        if expr.is_none() && keys.len() < 2 {
            return Ok(None);
        }
        for (name, t) in &columns {
            if !crate::scan::supported_type(t) && byte_family(t).is_none() {
                return Err(format!("the filter reads {name} of type {t}"));
            }
        }
        let (mut literals, mut patterns) = (Vec::new(), Vec::new());
        let (programs, text) = match &expr {
            Some(expr) => {
                let numbered = number_string_literals(expr, &mut columns, &mut literals, &mut patterns)?;
                // A numbered string column reads as Int64.
                let schema = Arc::new(Schema::new(
                    columns
                        .iter()
                        .map(|(n, t)| {
                            Field::new(
                                n.clone(),
                                if byte_family(t).is_some() { DataType::Int64 } else { t.clone() },
                                true,
                            )
                        })
                        .collect::<Vec<_>>(),
                ));
                let filter =
                    PairFilter { expr: numbered, columns: (0..columns.len()).map(|i| (true, i)).collect(), schema };
                let programs = compile(&filter, None).map_err(|why| format!("filter {expr}: {why}"))?;
                (programs.filter, expr.to_string())
            }
            None => (Vec::new(), String::new()),
        };
        let first_key = columns.len();
        columns.extend(keys.iter().map(|(n, t)| (n.to_string(), (*t).clone())));
        // `test` of each key column, joined by `join` (IS NOT NULL by AND, IS NULL by OR).
        let key_tests = |test: u32, join: u32| {
            let mut p = Vec::new();
            for c in 0..keys.len() {
                p.extend([Instr::new(op::COL, (first_key + c) as u32, 0), Instr::new(test, 0, 0)]);
                if c > 0 {
                    p.push(Instr::new(join, 0, 0));
                }
            }
            p
        };
        let with = |test: u32, join: u32| {
            let mut p = programs.clone();
            p.extend(key_tests(test, join));
            if !programs.is_empty() {
                p.push(Instr::new(op::AND, 0, 0));
            }
            p
        };
        Ok(Some(Self {
            columns,
            keep_valid: with(op::IS_NOT_NULL, op::AND),
            keep_null: with(op::IS_NULL, op::OR),
            text,
            literals,
            patterns,
        }))
    }
}

impl DeviceScanExec {
    /// A device scan of `key` (an expression over `input`'s output) for
    /// `input`, or the reason there can be none.
    /// With `payload` (the columns of `input` the operator outputs), the
    /// input's rows are output too: the device decodes those columns (none of
    /// the input's may be computed; those output must be of a type it
    /// decodes), and the operator builds its output from them.
    pub fn try_from_input(
        input: &Arc<dyn ExecutionPlan>,
        key: &PhysicalExprRef,
        key_type: &DataType,
        payload: Option<&[usize]>,
    ) -> std::result::Result<Self, String> {
        Self::try_from_input_keys(input, std::slice::from_ref(key), std::slice::from_ref(key_type), payload)
    }

    /// [`Self::try_from_input`] for a key of one or more columns (`keys`,
    /// each of its type in `key_types`). A composite key's columns must each
    /// be an exact fixed-width type (integers, dates, decimals of at most 18
    /// digits): the device packs them into one 64-bit key.
    pub fn try_from_input_keys(
        input: &Arc<dyn ExecutionPlan>,
        keys: &[PhysicalExprRef],
        key_types: &[DataType],
        payload: Option<&[usize]>,
    ) -> std::result::Result<Self, String> {
        if keys.is_empty() || keys.len() != key_types.len() {
            return Err("no key".into());
        }
        if keys.len() > MAX_KEY_COLUMNS {
            return Err(format!("{} key columns (the device packs at most {MAX_KEY_COLUMNS})", keys.len()));
        }
        let mut key_columns = Vec::with_capacity(keys.len());
        for (key, key_type) in keys.iter().zip(key_types) {
            let Some(col) = key.downcast_ref::<Column>() else { return Err(format!("key {key} is not a column")) };
            let data_type = input.schema().field(col.index()).data_type().clone();
            if &data_type != key_type {
                return Err(format!("key type {data_type} is coerced to {key_type}"));
            }
            if !crate::scan::supported_key_type(&data_type) {
                return Err(format!("type {data_type}"));
            }
            if keys.len() > 1 && (crate::scan::is_byte_type(&data_type) || !crate::keys::is_exact(&[data_type.clone()]))
            {
                return Err(format!("a composite key with a column of type {data_type}"));
            }
            key_columns.push((col.index(), data_type));
        }
        let (col_index, data_type) = key_columns[0].clone();
        // Follow the key column down to the scan, gathering the filters on the way.
        let mut filters: Chain = Vec::new();
        let (node, index) = follow_down(input.clone(), col_index, Some(&mut filters))?;
        let Some(ds) = node.downcast_ref::<DataSourceExec>() else {
            return Err(format!("input {} is not a Parquet scan", node.name()));
        };
        let Some((config, source)) = ds.downcast_to_file_source::<ParquetSource>() else {
            return Err("input is not a Parquet scan".into());
        };
        if config.limit.is_some() {
            return Err("a limit on the Parquet scan".into());
        }
        if config.object_store_url.as_str() != "file:///" {
            return Err(format!("object store {} is not the local file system", config.object_store_url.as_str()));
        }
        let table = config.file_source().table_schema();
        let file_schema = table.file_schema().clone();
        // A column of the scan's output as a column of the files.
        let file_index = |index: usize| -> std::result::Result<usize, String> {
            let i = match config.file_source().projection() {
                Some(p) => {
                    let Some(e) = p.iter().nth(index) else { return Err("scan projection".into()) };
                    let Some(c) = e.expr.downcast_ref::<Column>() else {
                        return Err(format!("column computed by {} in the scan", e.expr));
                    };
                    c.index()
                }
                None => index,
            };
            if i >= file_schema.fields().len() {
                return Err("a partition column".into());
            }
            Ok(i)
        };
        let key_file = file_index(index).map_err(|why| format!("key: {why}"))?;
        let field = file_schema.field(key_file);
        if field.data_type() != &data_type {
            return Err(format!("schema adaptation: {} read as {data_type}", field.data_type()));
        }
        // A composite key's other columns, read from the same scan.
        let mut more_keys = Vec::new();
        for (at, t) in &key_columns[1..] {
            let (n, i) = follow_down(input.clone(), *at, None)?;
            if !Arc::ptr_eq(&n, &node) {
                return Err(format!("a key column from {}", n.name()));
            }
            let f = file_schema.field(file_index(i).map_err(|why| format!("key: {why}"))?);
            if f.data_type() != t {
                return Err(format!("schema adaptation: {} read as {t}", f.data_type()));
            }
            more_keys.push((f.name().clone(), t.clone()));
        }
        // The filters over the files' columns (by their index in the files).
        let file_column = |i: usize| Column::new(file_schema.field(i).name(), i);
        let mut over_files: Vec<PhysicalExprRef> = Vec::new();
        for (below, predicate) in filters {
            over_files.push(rewrite_columns(&predicate, |c| {
                let (n, i) = follow_down(below.clone(), c.index(), None)?;
                if Arc::ptr_eq(&n, &node) {
                    Ok(file_column(file_index(i)?))
                } else {
                    Err(format!("the filter reads {} from {}", c.name(), n.name()))
                }
            })?);
        }
        let mut prune = over_files.clone();
        // The scan's own predicate: dynamic filters (this node's own, a TopK's
        // above) only let a scan skip rows that cannot matter, and the device
        // reads every row instead; without `pushdown_filters` the rest only
        // prunes row groups and pages whose rows a FilterExec removes anyway.
        // With it, the scan removes rows itself: the device must too.
        if let Some(filter) = config.file_source().filter() {
            let row_level = source.table_parquet_options().global.pushdown_filters;
            for c in datafusion::physical_expr::split_conjunction(&filter) {
                if c.downcast_ref::<DynamicFilterPhysicalExpr>().is_some() {
                    continue;
                }
                let over_file = rewrite_columns(c, |col| match file_schema.index_of(col.name()) {
                    Ok(f) => Ok(file_column(f)),
                    Err(_) => Err(format!("the scan's filter reads {}", col.name())),
                });
                match over_file {
                    Ok(e) if row_level => {
                        prune.push(e.clone());
                        over_files.push(e);
                    }
                    Ok(e) => prune.push(e),
                    Err(why) if row_level => return Err(why),
                    // Only pruning: DataFusion's scan may skip it too.
                    Err(_) => {}
                }
            }
        }
        // The filters over the file columns they read, numbered in order of first use.
        let mut read: Vec<usize> = Vec::new();
        let mut predicates: Vec<PhysicalExprRef> = Vec::new();
        for e in &over_files {
            predicates.push(rewrite_columns(e, |c| {
                let at = read.iter().position(|&r| r == c.index()).unwrap_or_else(|| {
                    read.push(c.index());
                    read.len() - 1
                });
                Ok(Column::new(c.name(), at))
            })?);
        }
        let bloom_filters = source.table_parquet_options().global.bloom_filter_on_read;
        let page_index = source.table_parquet_options().global.enable_page_index;
        let prune = prune
            .into_iter()
            .reduce(|a, b| Arc::new(BinaryExpr::new(a, Operator::And, b)) as _)
            .map(|e| (file_schema.clone(), e));
        let columns: Vec<(String, DataType)> = read
            .iter()
            .map(|&i| (file_schema.field(i).name().clone(), file_schema.field(i).data_type().clone()))
            .collect();
        let keys: Vec<(&str, &DataType)> = std::iter::once((field.name().as_str(), &data_type))
            .chain(more_keys.iter().map(|(n, t)| (n.as_str(), t)))
            .collect();
        let filter = ScanFilter::compile(predicates, columns, &keys)?;
        let payload = if let Some(output) = payload {
            let schema = input.schema();
            let columns = schema
                .fields()
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let (n, at) = follow_down(input.clone(), i, None)?;
                    let file = if Arc::ptr_eq(&n, &node) { file_index(at)? } else { return Err("a column".into()) };
                    let in_file = file_schema.field(file);
                    let decoded = crate::scan::supported_type(f.data_type()) || !output.contains(&i);
                    if !decoded || in_file.data_type() != f.data_type() {
                        return Err(format!("{} of type {}", f.name(), f.data_type()));
                    }
                    Ok((in_file.name().clone(), f.data_type().clone()))
                })
                .collect::<std::result::Result<Vec<_>, String>>()
                .map_err(|why| format!("its rows are output: {why}"))?;
            Some(columns)
        } else {
            None
        };
        // Each file once, with the byte ranges DataFusion split it into.
        let mut by_path: BTreeMap<PathBuf, Vec<(u64, u64)>> = BTreeMap::new();
        let mut whole: std::collections::BTreeSet<PathBuf> = Default::default();
        for group in &config.file_groups {
            for f in group.iter() {
                let path = crate::scan::local_path(f);
                match &f.range {
                    Some(r) => by_path.entry(path).or_default().push((r.start.max(0) as u64, r.end.max(0) as u64)),
                    None => {
                        whole.insert(path.clone());
                        by_path.entry(path).or_default();
                    }
                }
            }
        }
        let files = by_path
            .into_iter()
            .map(|(path, ranges)| ScanFile { ranges: if whole.contains(&path) { vec![] } else { ranges }, path })
            .collect();
        Ok(Self {
            input: input.clone(),
            files,
            column: field.name().clone(),
            data_type,
            more_keys,
            filter,
            prune,
            bloom_filters,
            page_index,
            payload,
            ran: Arc::new(Mutex::new(None)),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// The row groups a filtered input reads: those whose statistics (and
    /// bloom filters) allow a row its filters keep, and within them the rows
    /// the page index leaves, as DataFusion's scan would read (the other
    /// columns of the input are read with the same row groups and rows); and
    /// what was pruned.
    pub fn row_groups_to_read(&self) -> Result<(crate::scan::Keep, Option<crate::scan::pages::Pruned>)> {
        let pruned = match &self.prune {
            Some((schema, predicate)) => {
                crate::scan::prune_row_groups(&self.files, schema, predicate, self.bloom_filters, self.page_index)?
            }
            None => None,
        };
        let keep = crate::scan::Keep {
            key_range: None,
            row_groups: pruned.as_ref().map(|p| p.row_groups.clone()),
            rows: pruned.as_ref().and_then(|p| p.rows.clone()),
        };
        Ok((keep, pruned))
    }

    /// The input's columns as file columns, when the device decodes them for the output.
    pub fn payload(&self) -> Option<&[(String, DataType)]> {
        self.payload.as_deref()
    }

    /// The decompressed bytes of the pages this scan inflates on host threads,
    /// and of the ZSTD pages the device decompresses (its key, filter and
    /// output columns: [`crate::scan::inflated_bytes`]).
    pub fn inflated_bytes(&self) -> crate::scan::InflatedBytes {
        let mut columns: Vec<&str> = vec![self.column()];
        let filter = self.filter().map(|f| f.columns.as_slice()).unwrap_or_default();
        let payload = self.payload().unwrap_or_default();
        for (name, _) in filter.iter().chain(payload) {
            if !columns.contains(&name.as_str()) {
                columns.push(name);
            }
        }
        crate::scan::inflated_bytes(self.files(), &columns)
    }

    /// The filter the device applies to the rows before taking their keys (None: every row).
    pub fn filter(&self) -> Option<&ScanFilter> {
        self.filter.as_ref()
    }
    pub fn files(&self) -> &[ScanFile] {
        &self.files
    }
    pub fn column(&self) -> &str {
        &self.column
    }
    pub fn data_type(&self) -> &DataType {
        &self.data_type
    }
    /// A composite key's columns after the first ([`Self::column`]), in key order (empty: one key column).
    pub fn more_keys(&self) -> &[(String, DataType)] {
        &self.more_keys
    }
    /// The key's columns.
    pub fn key_count(&self) -> usize {
        1 + self.more_keys.len()
    }
    /// The subtree the node stands for.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
    /// Record what the device scan did (shown by EXPLAIN ANALYZE).
    pub fn set_ran(&self, report: &crate::scan::ScanReport) {
        let cache = report.cache.map(|c| format!(", {c}")).unwrap_or_default();
        let shared = match report.shared_columns {
            0 => String::new(),
            n => format!(", {n} columns read with the other input's"),
        };
        let what = format!("{} rows, {:.1} MB of pages{shared}{cache}", report.rows, report.bytes_read as f64 / 1e6);
        *self.ran.lock().unwrap_or_else(|e| e.into_inner()) = Some(what);
    }
}

impl DisplayAs for DeviceScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        if self.more_keys.is_empty() {
            write!(f, "DeviceScanExec: column={}, type={}", self.column, self.data_type)?;
        } else {
            let names: Vec<&str> = self.more_keys.iter().map(|(n, _)| n.as_str()).collect();
            let types: Vec<String> = self.more_keys.iter().map(|(_, t)| t.to_string()).collect();
            write!(
                f,
                "DeviceScanExec: columns=[{}, {}], types=[{}, {}]",
                self.column,
                names.join(", "),
                self.data_type,
                types.join(", ")
            )?;
        }
        write!(f, ", files={}", self.files.len())?;
        if let Some(filter) = self.filter.as_ref().filter(|f| !f.text.is_empty()) {
            write!(f, ", filter={}", filter.text)?;
        }
        if let Some(payload) = &self.payload {
            let names: Vec<&str> = payload.iter().map(|(n, _)| n.as_str()).collect();
            write!(f, ", output=[{}]", names.join(", "))?;
        }
        if !matches!(t, DisplayFormatType::TreeRender) {
            if let Some(ran) = self.ran.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                write!(f, ", ran=\"{ran}\"")?;
            }
        }
        Ok(())
    }
}

impl ExecutionPlan for DeviceScanExec {
    fn name(&self) -> &str {
        "DeviceScanExec"
    }
    fn schema(&self) -> SchemaRef {
        self.input.schema()
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }
    /// A leaf to the optimizer: the subtree it stands for stays as planned.
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }
    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal("DeviceScanExec has no children".into()))
        }
    }
    /// The input this node stands for is reset too (DataFusion's scans keep
    /// per-execution state): it runs when the host reads the input.
    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        let input = datafusion::physical_plan::execution_plan::reset_plan_states(self.input.clone())?;
        Ok(Arc::new(Self {
            input,
            files: self.files.clone(),
            column: self.column.clone(),
            data_type: self.data_type.clone(),
            more_keys: self.more_keys.clone(),
            filter: self.filter.clone(),
            prune: self.prune.clone(),
            bloom_filters: self.bloom_filters,
            page_index: self.page_index,
            payload: self.payload.clone(),
            ran: Arc::new(Mutex::new(None)),
            metrics: ExecutionPlanMetricsSet::new(),
        }))
    }
    /// The key column is read as is: no expression of its own.
    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn datafusion::physical_expr::PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }
    /// Executed by anyone but a set selection: the original scan's batches
    /// (the subtree's work is its own: this node's elapsed_compute stays 0).
    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let stream = self.input.execute(partition, context)?;
        let schema = stream.schema();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, super::observed(Box::pin(stream), baseline))))
    }
    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{
        Array, AsArray, BooleanArray, Date32Array, Int32Array, Int64Array, RecordBatch, StringArray,
    };
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use datafusion::physical_expr::expressions::Column;
    use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
    use parquet::file::properties::WriterProperties;

    use super::DeviceScanExec;
    use crate::algo::join_filter::{pass_rows_cpu, RowColumn};
    use crate::algo::row_hash::{match_like_cpu, match_literals_cpu};

    /// Two files of k BIGINT (NULLs), x INT (NULLs), d DATE, s VARCHAR (NULLs,
    /// empty strings), b BOOLEAN (NULLs), in several row groups.
    fn write_files(dir: &std::path::Path) {
        std::fs::create_dir_all(dir).unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("x", DataType::Int32, true),
            Field::new("d", DataType::Date32, false),
            Field::new("s", DataType::Utf8, true),
            Field::new("b", DataType::Boolean, true),
        ]));
        for f in 0..2i64 {
            let n = 3000i64;
            let k: Int64Array = (0..n).map(|i| (i % 13 != 5).then_some((i * 37 + f) % 900 - 100)).collect();
            let x: Int32Array = (0..n).map(|i| (i % 7 != 2).then_some(((i * 11) % 200) as i32 - 50)).collect();
            let d: Date32Array = (0..n).map(|i| Some(19000 + (i % 400) as i32)).collect();
            let s: StringArray = (0..n)
                .map(|i| (i % 19 != 7).then(|| if i % 23 == 0 { String::new() } else { format!("s{}", i % 5) }))
                .collect();
            let b: BooleanArray = (0..n).map(|i| (i % 11 != 4).then_some(i % 3 == 0)).collect();
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(k), Arc::new(x), Arc::new(d), Arc::new(s), Arc::new(b)],
            )
            .unwrap();
            let props = WriterProperties::builder()
                .set_max_row_group_row_count(Some(700))
                .set_dictionary_enabled(f == 0)
                .build();
            crate::scan::fixtures::write_file(&dir.join(format!("part-{f}.parquet")), &batch, props).unwrap();
        }
    }

    /// A string column's values in the files' order, as arrow-rs reads them.
    fn string_values(files: &[crate::scan::ScanFile], name: &str) -> Vec<Option<Vec<u8>>> {
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        let mut out = Vec::new();
        for f in files {
            let b = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&f.path).unwrap()).unwrap();
            let mask = parquet::arrow::ProjectionMask::columns(b.parquet_schema(), [name]);
            for batch in b.with_projection(mask).build().unwrap() {
                let a = datafusion::arrow::compute::cast(batch.unwrap().column(0), &DataType::Binary).unwrap();
                let a = a.as_binary::<i32>();
                out.extend((0..a.len()).map(|i| a.is_valid(i).then(|| a.value(i).to_vec())));
            }
        }
        out
    }

    /// The kept rows' keys by the device scan's filter, evaluated by its CPU
    /// twin over the columns decoded on the host: sorted, NULLs as None.
    fn twin_keys(scan: &DeviceScanExec) -> Vec<Option<i64>> {
        let filter = scan.filter().expect("a filter");
        let mut decoded: Vec<crate::scan::Decoded> = filter
            .columns
            .iter()
            .map(|(name, t)| {
                crate::scan::scan_to_host(scan.files(), name, t).unwrap().unwrap_or_else(|f| panic!("{}", f.0))
            })
            .collect();
        // String columns as the programs read them: the number of the literal each row equals.
        for l in &filter.literals {
            let values = string_values(scan.files(), &filter.columns[l.column].0);
            decoded[l.column].keys = match_literals_cpu(values.iter().map(|v| v.as_deref()), &l.literals);
        }
        for p in &filter.patterns {
            let values = string_values(scan.files(), &filter.columns[p.column].0);
            decoded[p.column].keys = match_like_cpu(values.iter().map(|v| v.as_deref()), &p.pattern);
        }
        let n = decoded[0].keys.len();
        let cols: Vec<RowColumn> =
            decoded.iter().map(|d| RowColumn { values: &d.keys, validity: d.valid.as_deref() }).collect();
        let bits = |prog| pass_rows_cpu(&cols, n, prog).unwrap().expect("no overflow");
        let (valid, null) = (bits(&filter.keep_valid), bits(&filter.keep_null));
        let key = decoded.last().unwrap();
        let mut out: Vec<Option<i64>> = Vec::new();
        for r in 0..n {
            if valid[r / 32] >> (r % 32) & 1 == 1 {
                out.push(Some(key.keys[r] as i64));
            }
            if null[r / 32] >> (r % 32) & 1 == 1 {
                out.push(None);
            }
        }
        out.sort();
        out
    }

    /// The filters between a semi join's input and its Parquet scan (a
    /// FilterExec, the scan's own predicate with `pushdown_filters`) are taken
    /// by the device scan, and its filter keeps exactly DataFusion's rows;
    /// what the device cannot evaluate is refused with the reason.
    #[test]
    fn scan_filters_keep_datafusions_rows() {
        let dir = std::env::temp_dir().join(format!("setfusion-scan-filter-{}", std::process::id()));
        write_files(&dir);
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            for pushdown in [false, true] {
                let mut config = SessionConfig::new().with_target_partitions(3);
                config.options_mut().execution.parquet.pushdown_filters = pushdown;
                let ctx = SessionContext::new_with_config(config);
                ctx.register_parquet("t", dir.to_str().unwrap(), ParquetReadOptions::default()).await.unwrap();
                for filter in [
                    "x > 10",
                    "x > 10 AND d < DATE '2022-06-01'",
                    "k + x > 100 OR x IS NULL",
                    "NOT (x BETWEEN -5 AND 20) AND k IS NOT NULL",
                    "k IS NULL OR x = 3",
                    "CAST(x AS BIGINT) * 3 < k",
                    // BOOLEAN columns (NULLs among them), decoded by the device too.
                    "b",
                    "NOT b AND x > 0",
                    "b IS NULL OR k < 0",
                    "b = true OR x = 3",
                    "b AND k IS NULL",
                    // String columns compared with literals (NULLs, empty strings), IN lists.
                    "s = 's1'",
                    "s <> 's1' AND x > 0",
                    "s IN ('s1', 's3', '')",
                    "s NOT IN ('s2', 's4') OR k IS NULL",
                    "'s0' = s OR b",
                    "s IS NULL OR s = ''",
                    "s IN ('s1', NULL) AND x < 30",
                    "x IN (1, 2, 3, -50) OR s = 's9'",
                    // LIKE patterns with `%` only, a column of their own each.
                    "s LIKE 's%'",
                    "s NOT LIKE '%3' AND x > 0",
                    "s LIKE '%1%' OR s LIKE '' OR b",
                    "s LIKE 's1' OR (s = 's2' AND s NOT LIKE 's%2')",
                ] {
                    let sql = format!("SELECT k FROM t WHERE {filter}");
                    let df = ctx.sql(&sql).await.unwrap();
                    let plan = df.clone().create_physical_plan().await.unwrap();
                    let key: Arc<dyn datafusion::physical_expr::PhysicalExpr> = Arc::new(Column::new("k", 0));
                    let scan = DeviceScanExec::try_from_input(&plan, &key, &DataType::Int64, None)
                        .unwrap_or_else(|why| panic!("{sql} (pushdown {pushdown}): {why}"));
                    let mut want: Vec<Option<i64>> = df
                        .collect()
                        .await
                        .unwrap()
                        .iter()
                        .flat_map(|b| {
                            let a = b.column(0).as_primitive::<Int64Type>();
                            (0..a.len()).map(|i| a.is_valid(i).then(|| a.value(i))).collect::<Vec<_>>()
                        })
                        .collect();
                    want.sort();
                    assert!(!want.is_empty(), "{sql}");
                    assert_eq!(twin_keys(&scan), want, "{sql} (pushdown {pushdown})");
                }
                // Refused, with the reason.
                for (filter, why) in [
                    ("s < 's1'", "other than"),
                    ("s LIKE 's_'", "LIKE pattern"),
                    ("s ILIKE 'S%'", "ILIKE"),
                    ("x % 7 = 1", "filter"),
                ] {
                    let sql = format!("SELECT k FROM t WHERE {filter}");
                    let plan = ctx.sql(&sql).await.unwrap().create_physical_plan().await.unwrap();
                    let key: Arc<dyn datafusion::physical_expr::PhysicalExpr> = Arc::new(Column::new("k", 0));
                    let got = DeviceScanExec::try_from_input(&plan, &key, &DataType::Int64, None).map(|_| ());
                    assert!(matches!(&got, Err(w) if w.contains(why)), "{sql}: {got:?}");
                }
                // No filter: none to apply.
                let plan = ctx.sql("SELECT k FROM t").await.unwrap().create_physical_plan().await.unwrap();
                let key: Arc<dyn datafusion::physical_expr::PhysicalExpr> = Arc::new(Column::new("k", 0));
                assert!(DeviceScanExec::try_from_input(&plan, &key, &DataType::Int64, None)
                    .unwrap()
                    .filter()
                    .is_none());
            }
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Executed by anyone but a set selection, the node passes the scan's
    /// rows on with DataFusion's baseline metrics.
    #[tokio::test]
    async fn host_rows_carry_baseline_metrics() {
        let dir = std::env::temp_dir().join(format!("setfusion-scan-metrics-{}", std::process::id()));
        write_files(&dir);
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(2));
        ctx.register_parquet("t", dir.to_str().unwrap(), ParquetReadOptions::default()).await.unwrap();
        let plan = ctx.sql("SELECT k FROM t WHERE x > 10").await.unwrap().create_physical_plan().await.unwrap();
        let key: Arc<dyn datafusion::physical_expr::PhysicalExpr> = Arc::new(Column::new("k", 0));
        let scan = DeviceScanExec::try_from_input(&plan, &key, &DataType::Int64, None).unwrap();
        let scan: Arc<dyn datafusion::physical_plan::ExecutionPlan> = Arc::new(scan);
        let batches = datafusion::physical_plan::collect(scan.clone(), ctx.task_ctx()).await.unwrap();
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        assert!(rows > 0);
        crate::exec::metrics_check::check(&scan, "DeviceScanExec", rows, false);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
