//! Aggregates over the rows a set selection keeps, absorbed by the selection
//! (`SetSelectExec::with_aggregate_above`): `count(*)`, `count(c)`,
//! `sum(c)`, `min(c)` and `max(c)` without grouping.
//!
//! Where the device read and decoded the kept rows' columns, it reduces them
//! there ([`gpu::reduce_kept`]) and four numbers a column come back instead
//! of the rows. Wherever the rows reach the host instead (the selection's
//! host path, a device scan that fell back), the same aggregates are folded
//! over the selection's output batches ([`Folding`]) with the reduction's
//! CPU twin. Either way the answer is DataFusion's: `count` is never NULL,
//! `sum` of integers is a 64-bit sum that wraps (as DataFusion's does) and is
//! NULL over no value, `min` and `max` too.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Date32Array, Int16Array, Int32Array, Int64Array, Int8Array, RecordBatch,
};
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Int16Type, Int32Type, Int64Type, Int8Type, Schema, SchemaRef,
};
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::expressions::{CastExpr, Column, Literal};
use datafusion::physical_expr::PhysicalExprRef;

use crate::gpu::{self, KeptAggregates};

/// One aggregate over the kept rows; the column is one of the selection's
/// output columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeptAggregate {
    /// `count(*)`: the kept rows.
    Rows,
    /// `count(c)`: the kept rows with a value in c.
    Count(usize),
    Sum(usize),
    Min(usize),
    Max(usize),
}

impl KeptAggregate {
    fn column(self) -> Option<usize> {
        match self {
            KeptAggregate::Rows => None,
            KeptAggregate::Count(c) | KeptAggregate::Sum(c) | KeptAggregate::Min(c) | KeptAggregate::Max(c) => Some(c),
        }
    }
}

/// The aggregates absorbed by a set selection, and the one-row output they
/// make (the replaced aggregate's schema).
#[derive(Debug)]
pub struct AggregateAbove {
    aggregates: Vec<KeptAggregate>,
    /// The aggregates as DataFusion named them, for EXPLAIN.
    names: Vec<String>,
    schema: SchemaRef,
}

/// Integer types whose values the reduction takes as 64-bit lanes (and a
/// device scan decodes as such, sign-extended).
fn is_integer_lane(t: &DataType) -> bool {
    matches!(t, DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 | DataType::Date32)
}

impl AggregateAbove {
    /// The aggregates `aggregates` (of an aggregate without grouping; `filters`
    /// their FILTER clauses), whose arguments are columns of `input`, that
    /// column `i` of which is the selection's output column `columns[i]`
    /// (`selected`: the selection's output schema); `schema`: the
    /// aggregate's output. Err: why the aggregate stays.
    pub(crate) fn try_new(
        aggregates: &[Arc<AggregateFunctionExpr>],
        filters: &[Option<PhysicalExprRef>],
        input: &Schema,
        columns: &[usize],
        selected: &Schema,
        schema: SchemaRef,
    ) -> std::result::Result<Self, String> {
        if filters.iter().any(Option::is_some) {
            return Err("an aggregate with a FILTER clause".into());
        }
        if columns.len() != input.fields().len() || columns.iter().any(|&c| c >= selected.fields().len()) {
            return Err("the aggregate's input columns are not the selection's".into());
        }
        if schema.fields().len() != aggregates.len() {
            return Err("an aggregate whose output is not one column per function".into());
        }
        let mut out = Vec::with_capacity(aggregates.len());
        for (a, field) in aggregates.iter().zip(schema.fields()) {
            let name = a.fun().name().to_ascii_lowercase();
            if a.is_distinct() || !a.order_bys().is_empty() {
                return Err(format!("{}: DISTINCT or ORDER BY", a.name()));
            }
            let args = a.expressions();
            let [arg] = args.as_slice() else { return Err(format!("{}: not one argument", a.name())) };
            // The selection's output column under an argument that is a column (or,
            // for sum, an integer column cast to BIGINT, as DataFusion coerces it).
            let column_of = |e: &PhysicalExprRef| -> Option<(usize, DataType)> {
                let c = e.downcast_ref::<Column>()?;
                let at = *columns.get(c.index())?;
                Some((at, selected.field(at).data_type().clone()))
            };
            let lane_column = |e: &PhysicalExprRef| -> Option<(usize, DataType)> {
                column_of(e).or_else(|| {
                    let cast = e.downcast_ref::<CastExpr>()?;
                    (cast.cast_type() == &DataType::Int64).then(|| column_of(cast.expr())).flatten()
                })
            };
            let wanted = field.data_type();
            let aggregate = match name.as_str() {
                "count" => {
                    if *wanted != DataType::Int64 {
                        return Err(format!("{}: of type {wanted}", a.name()));
                    }
                    match arg.downcast_ref::<Literal>() {
                        Some(l) if !l.value().is_null() => KeptAggregate::Rows,
                        Some(_) => return Err(format!("{}: of NULL", a.name())),
                        None => match column_of(arg) {
                            Some((c, _)) => KeptAggregate::Count(c),
                            None => return Err(format!("{}: not of a column", a.name())),
                        },
                    }
                }
                "sum" => match lane_column(arg) {
                    Some((c, t)) if is_integer_lane(&t) && t != DataType::Date32 && *wanted == DataType::Int64 => {
                        KeptAggregate::Sum(c)
                    }
                    _ => return Err(format!("{}: not a sum of an integer column", a.name())),
                },
                "min" | "max" => match column_of(arg) {
                    Some((c, t)) if is_integer_lane(&t) && t == *wanted => {
                        if name == "min" {
                            KeptAggregate::Min(c)
                        } else {
                            KeptAggregate::Max(c)
                        }
                    }
                    _ => return Err(format!("{}: not of an integer or date column", a.name())),
                },
                _ => return Err(format!("{}: a function the selection does not compute", a.name())),
            };
            out.push(aggregate);
        }
        let names = aggregates.iter().map(|a| a.name().to_string()).collect();
        Ok(AggregateAbove { aggregates: out, names, schema })
    }

    /// The selection's output columns the aggregates read, ascending.
    pub(crate) fn columns_read(&self) -> Vec<usize> {
        let mut c: Vec<usize> = self.aggregates.iter().filter_map(|a| a.column()).collect();
        c.sort_unstable();
        c.dedup();
        c
    }

    /// The one-row output.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The aggregates, for EXPLAIN.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The output row from the kept rows' number and each column's
    /// aggregates (`columns[c]`: the selection's output column c; a column
    /// past the slice's end holds no value).
    pub(crate) fn row(&self, rows: u64, columns: &[KeptAggregates]) -> Result<RecordBatch> {
        let arrays: Vec<ArrayRef> = self
            .aggregates
            .iter()
            .zip(self.schema.fields())
            .map(|(&a, field)| -> Result<ArrayRef> {
                let agg = a.column().and_then(|c| columns.get(c).copied()).unwrap_or(KeptAggregates::EMPTY);
                let value = |v: i64| (agg.values > 0).then_some(v);
                Ok(match a {
                    KeptAggregate::Rows => Arc::new(Int64Array::from(vec![rows as i64])),
                    KeptAggregate::Count(_) => Arc::new(Int64Array::from(vec![agg.values as i64])),
                    KeptAggregate::Sum(_) => Arc::new(Int64Array::from(vec![value(agg.sum)])),
                    KeptAggregate::Min(_) | KeptAggregate::Max(_) => {
                        let v = value(if matches!(a, KeptAggregate::Min(_)) { agg.min } else { agg.max });
                        lane_array(field.data_type(), v)?
                    }
                })
            })
            .collect::<Result<_>>()?;
        Ok(RecordBatch::try_new(self.schema.clone(), arrays)?)
    }
}

/// One value (a 64-bit lane, sign-extended) as a one-row array of `t`.
fn lane_array(t: &DataType, v: Option<i64>) -> Result<ArrayRef> {
    Ok(match t {
        DataType::Int64 => Arc::new(Int64Array::from(vec![v])),
        DataType::Int32 => Arc::new(Int32Array::from(vec![v.map(|v| v as i32)])),
        DataType::Int16 => Arc::new(Int16Array::from(vec![v.map(|v| v as i16)])),
        DataType::Int8 => Arc::new(Int8Array::from(vec![v.map(|v| v as i8)])),
        DataType::Date32 => Arc::new(Date32Array::from(vec![v.map(|v| v as i32)])),
        other => {
            return Err(DataFusionError::Internal(format!("setfusion: an absorbed min / max of type {other}")));
        }
    })
}

/// The aggregates of every row of one output column (its values, where it
/// is of an integer type; else only how many rows hold one), by the CPU twin
/// of the device's reduction.
fn column_aggregates(array: &ArrayRef) -> KeptAggregates {
    let lanes: Option<Vec<i64>> = match array.data_type() {
        DataType::Int64 => None,
        DataType::Int32 => Some(array.as_primitive::<Int32Type>().values().iter().map(|&v| v as i64).collect()),
        DataType::Int16 => Some(array.as_primitive::<Int16Type>().values().iter().map(|&v| v as i64).collect()),
        DataType::Int8 => Some(array.as_primitive::<Int8Type>().values().iter().map(|&v| v as i64).collect()),
        DataType::Date32 => Some(array.as_primitive::<Date32Type>().values().iter().map(|&v| v as i64).collect()),
        _ => {
            let values = (array.len() - array.null_count()) as u64;
            return KeptAggregates { values, ..KeptAggregates::EMPTY };
        }
    };
    let values = match &lanes {
        Some(l) => l.as_slice(),
        None => array.as_primitive::<Int64Type>().values(),
    };
    let every = BooleanBuffer::new_set(array.len());
    let valid = array.logical_nulls().map(|n| n.inner().clone());
    gpu::reduce_kept_cpu(values, valid.as_ref(), &every)
}

/// The host's side of an absorbed aggregate: the selection's output batches
/// folded into the aggregates, as the replaced `AggregateExec` would have.
pub(crate) struct Folding<'a> {
    above: &'a AggregateAbove,
    rows: u64,
    /// The columns the aggregates read ([`AggregateAbove::columns_read`]).
    read: Vec<usize>,
    /// Per output column, its aggregates so far (of the columns read).
    columns: Vec<KeptAggregates>,
}

impl<'a> Folding<'a> {
    pub(crate) fn new(above: &'a AggregateAbove) -> Self {
        let read = above.columns_read();
        let columns = vec![KeptAggregates::EMPTY; read.last().map_or(0, |&c| c + 1)];
        Folding { above, rows: 0, read, columns }
    }

    /// One batch of the selection's output.
    pub(crate) fn add(&mut self, batch: &RecordBatch) -> Result<()> {
        self.rows += batch.num_rows() as u64;
        for &c in &self.read {
            let Some(array) = batch.columns().get(c) else {
                return Err(DataFusionError::Internal(format!(
                    "setfusion: an absorbed aggregate's column {c} missing"
                )));
            };
            self.columns[c] = self.columns[c].merge(column_aggregates(array));
        }
        Ok(())
    }

    pub(crate) fn finish(self) -> Result<RecordBatch> {
        self.above.row(self.rows, &self.columns)
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::Field;

    use super::*;

    /// The host fold gives DataFusion's answers: NULLs skipped, a wrapping
    /// sum, NULL sums and extremes over no value, narrow types kept.
    #[test]
    fn the_host_fold_answers_as_datafusion() {
        let selected = Schema::new(vec![
            Field::new("p", DataType::Int64, true),
            Field::new("q", DataType::Int32, true),
            Field::new("d", DataType::Date32, true),
        ]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("count(*)", DataType::Int64, false),
            Field::new("count(p)", DataType::Int64, false),
            Field::new("sum(p)", DataType::Int64, true),
            Field::new("min(q)", DataType::Int32, true),
            Field::new("max(d)", DataType::Date32, true),
            Field::new("sum(q)", DataType::Int64, true),
        ]));
        let above = AggregateAbove {
            aggregates: vec![
                KeptAggregate::Rows,
                KeptAggregate::Count(0),
                KeptAggregate::Sum(0),
                KeptAggregate::Min(1),
                KeptAggregate::Max(2),
                KeptAggregate::Sum(1),
            ],
            names: vec![],
            schema,
        };
        assert_eq!(above.columns_read(), vec![0, 1, 2]);
        let batch = |p: Vec<Option<i64>>, q: Vec<Option<i32>>, d: Vec<Option<i32>>| {
            RecordBatch::try_new(
                Arc::new(selected.clone()),
                vec![Arc::new(Int64Array::from(p)), Arc::new(Int32Array::from(q)), Arc::new(Date32Array::from(d))],
            )
            .unwrap()
        };
        let mut fold = Folding::new(&above);
        fold.add(&batch(vec![Some(i64::MAX), None, Some(2)], vec![Some(-5), Some(7), None], vec![None, None, None]))
            .unwrap();
        fold.add(&batch(vec![], vec![], vec![])).unwrap();
        fold.add(&batch(vec![Some(3)], vec![Some(i32::MIN)], vec![Some(19000)])).unwrap();
        let out = fold.finish().unwrap();
        let i64s = |c: usize| out.column(c).as_primitive::<Int64Type>().value(0);
        assert_eq!((i64s(0), i64s(1)), (4, 3));
        assert_eq!(i64s(2), i64::MAX.wrapping_add(5), "the sum wraps");
        assert_eq!(out.column(3).as_primitive::<Int32Type>().value(0), i32::MIN);
        assert_eq!(out.column(4).as_primitive::<Date32Type>().value(0), 19000);
        assert_eq!(i64s(5), -5 + 7 + i32::MIN as i64);

        // No row: counts 0, the rest NULL.
        let out = Folding::new(&above).finish().unwrap();
        assert_eq!(out.column(0).as_primitive::<Int64Type>().value(0), 0);
        assert_eq!(out.column(1).as_primitive::<Int64Type>().value(0), 0);
        assert!((2..6).all(|c| out.column(c).is_null(0)));
    }
}
