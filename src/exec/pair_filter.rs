//! A residual join filter compiled for the device (issue 14, item 3):
//! DataFusion's `PhysicalExpr` -> the postfix [`Programs`] that
//! `kernels/join_filter.cu` and its CPU twin interpret.
//!
//! What compiles: columns and literals of fixed-width types (integers, dates,
//! times, timestamps, floats, booleans, decimals of at most 18 digits);
//! comparisons of two operands of one type; `+ - *` and unary minus on
//! integers, floats and decimals (checked: a result outside its type's range
//! sends the whole operator back to DataFusion's expression); AND / OR / NOT
//! and IS [NOT] NULL; casts between integers, from integers and decimals to
//! floats and decimals, and f64 -> f32; float division. Anything else (strings, integer division,
//! functions, CASE, LIKE, ...) gives the reason it does not compile, and the
//! filter is evaluated on the host instead.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CastExpr, Column, IsNotNullExpr, IsNullExpr, Literal, NegativeExpr, NotExpr, TryCastExpr,
};
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_expr::{PhysicalExpr, PhysicalExprRef};

use crate::algo::join_filter::{op, Instr, Programs, ValueKind, RANGE_DEC, RANGE_I64, STACK};

/// A residual join filter over candidate pairs (`MarkJoinExec`'s): `expr`
/// reads an intermediate batch whose columns are `columns` (`(true, i)`:
/// probe column i; `(false, i)`: build column i), of `schema`. Defined here,
/// beside its compiler, so that the operator imports it and not the reverse.
#[derive(Debug, Clone)]
pub struct PairFilter {
    pub expr: PhysicalExprRef,
    pub columns: Vec<(bool, usize)>,
    pub schema: SchemaRef,
}

/// The device programs of a filter and, for IN, of its keys (the probe and
/// build key columns read as columns `m` and `m + 1`, after the filter's `m`).
/// Err: why the device cannot evaluate it.
pub fn compile(filter: &PairFilter, in_key_types: Option<(&DataType, &DataType)>) -> Result<Programs, String> {
    let m = filter.schema.fields().len();
    for f in filter.schema.fields() {
        if ValueKind::of(f.data_type()).is_none() {
            return Err(format!("the filter reads {} of type {}", f.name(), f.data_type()));
        }
    }
    let mut c = Compiler { schema: filter.schema.as_ref(), out: Vec::new(), depth: 0, max: 0 };
    let t = c.emit(&filter.expr)?;
    if t != DataType::Boolean {
        return Err(format!("the filter is of type {t}"));
    }
    let in_keys = match in_key_types {
        None => None,
        Some((p, b)) => {
            if p != b || ValueKind::of(p).is_none() {
                return Err(format!("IN keys of types {p} and {b}"));
            }
            let equal = if is_float(p) { op::EQ_F } else { op::EQ_I };
            let col = |i: usize| Instr::new(op::COL, i as u32, 0);
            Some((vec![col(m), col(m + 1), Instr::new(equal, 0, 0)], vec![col(m + 1), Instr::new(op::IS_NULL, 0, 0)]))
        }
    };
    Ok(Programs { filter: c.out, in_keys })
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float32 | DataType::Float64)
}

/// The checked range of an integer-lane type (None: not checkable, e.g. UInt64).
fn range_of(t: &DataType) -> Option<u32> {
    use DataType::*;
    Some(match t {
        Int8 => 1,
        Int16 => 2,
        Int32 | Date32 | Time32(_) => 3,
        UInt8 => 4,
        UInt16 => 5,
        UInt32 => 6,
        Int64 | Date64 | Timestamp(_, _) | Time64(_) | Duration(_) => RANGE_I64,
        // Wider decimals are held in the i64 lane too: only its overflow is checked.
        Decimal128(p, s) if *s >= 0 => {
            if *p <= 18 {
                RANGE_DEC + *p as u32
            } else {
                RANGE_I64
            }
        }
        _ => return None,
    })
}

fn is_integer(t: &DataType) -> bool {
    use DataType::*;
    matches!(t, Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32)
}

fn pow10(s: i8) -> Option<u64> {
    (0..=18).contains(&s).then(|| 10u64.pow(s as u32))
}

struct Compiler<'a> {
    schema: &'a Schema,
    out: Vec<Instr>,
    depth: usize,
    max: usize,
}

impl Compiler<'_> {
    fn push(&mut self, i: Instr, grows: isize) -> Result<(), String> {
        self.out.push(i);
        self.depth = (self.depth as isize + grows) as usize;
        self.max = self.max.max(self.depth);
        if self.max > STACK {
            return Err(format!("the filter needs a stack deeper than {STACK}"));
        }
        Ok(())
    }

    /// Emit `e`, returning its type.
    fn emit(&mut self, e: &Arc<dyn PhysicalExpr>) -> Result<DataType, String> {
        if collect_columns(e).is_empty() && e.downcast_ref::<Literal>().is_none() {
            // A constant (a cast of a literal, arithmetic on literals): its value.
            return self.literal(&constant(e)?);
        }
        let any = e.as_ref();
        if let Some(c) = any.downcast_ref::<Column>() {
            let t = self
                .schema
                .fields()
                .get(c.index())
                .map(|f| f.data_type().clone())
                .ok_or_else(|| format!("column {} out of range", c.index()))?;
            self.push(Instr::new(op::COL, c.index() as u32, 0), 1)?;
            return Ok(t);
        }
        if let Some(l) = any.downcast_ref::<Literal>() {
            return self.literal(l.value());
        }
        if let Some(b) = any.downcast_ref::<BinaryExpr>() {
            return self.binary(b);
        }
        if let Some(n) = any.downcast_ref::<NotExpr>() {
            let t = self.emit(n.arg())?;
            if t != DataType::Boolean {
                return Err(format!("NOT of {t}"));
            }
            self.push(Instr::new(op::NOT, 0, 0), 0)?;
            return Ok(t);
        }
        if let Some(n) = any.downcast_ref::<IsNullExpr>() {
            self.emit(n.arg())?;
            self.push(Instr::new(op::IS_NULL, 0, 0), 0)?;
            return Ok(DataType::Boolean);
        }
        if let Some(n) = any.downcast_ref::<IsNotNullExpr>() {
            self.emit(n.arg())?;
            self.push(Instr::new(op::IS_NOT_NULL, 0, 0), 0)?;
            return Ok(DataType::Boolean);
        }
        if let Some(n) = any.downcast_ref::<NegativeExpr>() {
            let t = self.emit(n.arg())?;
            return match &t {
                DataType::Float32 | DataType::Float64 => {
                    self.push(Instr::new(op::NEG_F, (t == DataType::Float32) as u32, 0), 0)?;
                    Ok(t)
                }
                _ => {
                    let range = range_of(&t).filter(|_| is_integer(&t) || matches!(t, DataType::Decimal128(_, _)));
                    let range = range.ok_or_else(|| format!("negation of {t}"))?;
                    self.push(Instr::new(op::NEG_I, range, 0), 0)?;
                    Ok(t)
                }
            };
        }
        if let Some(c) = any.downcast_ref::<CastExpr>() {
            return self.cast(c.expr(), c.cast_type());
        }
        if let Some(c) = any.downcast_ref::<TryCastExpr>() {
            // A failed TRY_CAST is NULL, not an error: the device's error flag
            // sends such rows to DataFusion's expression, which gives the NULL.
            return self.cast(c.expr(), c.cast_type());
        }
        Err(format!("`{e}` is not a device expression"))
    }

    fn literal(&mut self, v: &ScalarValue) -> Result<DataType, String> {
        let t = v.data_type();
        if v.is_null() {
            if ValueKind::of(&t).is_none() {
                return Err(format!("a NULL of {t}"));
            }
            self.push(Instr::new(op::NULL, 0, 0), 1)?;
            return Ok(t);
        }
        use ScalarValue::*;
        let bits: u64 = match v {
            Int8(Some(x)) => *x as i64 as u64,
            Int16(Some(x)) => *x as i64 as u64,
            Int32(Some(x)) | Date32(Some(x)) => *x as i64 as u64,
            Int64(Some(x)) | Date64(Some(x)) => *x as u64,
            UInt8(Some(x)) => *x as u64,
            UInt16(Some(x)) => *x as u64,
            UInt32(Some(x)) => *x as u64,
            TimestampSecond(Some(x), _)
            | TimestampMillisecond(Some(x), _)
            | TimestampMicrosecond(Some(x), _)
            | TimestampNanosecond(Some(x), _) => *x as u64,
            Float32(Some(x)) => (*x as f64).to_bits(),
            Float64(Some(x)) => x.to_bits(),
            Boolean(Some(x)) => *x as u64,
            Decimal128(Some(x), _, s) if *s >= 0 && i64::try_from(*x).is_ok() => *x as i64 as u64,
            _ => return Err(format!("a literal of {t}")),
        };
        self.push(Instr::new(op::LIT, 0, bits), 1)?;
        Ok(t)
    }

    fn binary(&mut self, b: &BinaryExpr) -> Result<DataType, String> {
        let lt = self.emit(b.left())?;
        let rt = self.emit(b.right())?;
        let o = *b.op();
        match o {
            Operator::And | Operator::Or => {
                if lt != DataType::Boolean || rt != DataType::Boolean {
                    return Err(format!("{o} of {lt} and {rt}"));
                }
                self.push(Instr::new(if o == Operator::And { op::AND } else { op::OR }, 0, 0), -1)?;
                Ok(DataType::Boolean)
            }
            Operator::Eq | Operator::NotEq | Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq => {
                if lt != rt {
                    return Err(format!("{lt} {o} {rt}"));
                }
                let k = match o {
                    Operator::Eq => 0,
                    Operator::NotEq => 1,
                    Operator::Lt => 2,
                    Operator::LtEq => 3,
                    Operator::Gt => 4,
                    _ => 5,
                };
                let base = if is_float(&lt) {
                    op::EQ_F
                } else if range_of(&lt).is_some() || lt == DataType::Boolean {
                    op::EQ_I
                } else {
                    return Err(format!("a comparison of {lt}"));
                };
                self.push(Instr::new(base + k, 0, 0), -1)?;
                Ok(DataType::Boolean)
            }
            Operator::Plus | Operator::Minus | Operator::Multiply => {
                let k = match o {
                    Operator::Plus => 0,
                    Operator::Minus => 1,
                    _ => 2,
                };
                let out = binary_type(&lt, &rt, o)?;
                // DataFusion's own result type must be the one computed here (no rescale,
                // no other lane); its precision bounds the checked range.
                let declared = b.data_type(self.schema).map_err(|e| e.to_string())?;
                let same = match (&out, &declared) {
                    (DataType::Decimal128(_, s1), DataType::Decimal128(_, s2)) => s1 == s2,
                    _ => out == declared,
                };
                if !same {
                    return Err(format!("{lt} {o} {rt} gives {declared}"));
                }
                let out = declared;
                if is_float(&out) {
                    if lt != out || rt != out {
                        return Err(format!("{lt} {o} {rt}"));
                    }
                    self.push(Instr::new(op::ADD_F + k, (out == DataType::Float32) as u32, 0), -1)?;
                } else {
                    let range = range_of(&out).ok_or_else(|| format!("arithmetic in {out}"))?;
                    self.push(Instr::new(op::ADD_I + k, range, 0), -1)?;
                }
                Ok(out)
            }
            Operator::Divide if is_float(&lt) && lt == rt => {
                // IEEE division (x / 0 is an infinity or NaN, as in Arrow); integer and
                // decimal division (truncation, division by zero errors) stay on the host.
                self.push(Instr::new(op::DIV_F, (lt == DataType::Float32) as u32, 0), -1)?;
                Ok(lt)
            }
            _ => Err(format!("the operator {o}")),
        }
    }

    fn cast(&mut self, child: &Arc<dyn PhysicalExpr>, to: &DataType) -> Result<DataType, String> {
        let from = self.emit(child)?;
        use DataType::*;
        let no = || Err(format!("a cast from {from} to {to}"));
        if &from == to {
            return Ok(from);
        }
        match (&from, to) {
            (f, t) if is_integer(f) && is_integer(t) => {
                let range = range_of(t).expect("integer");
                self.push(Instr::new(op::CHECK_I, range, 0), 0)?;
            }
            (f, Float32 | Float64) if is_integer(f) => self.push(Instr::new(op::I2F, (*to == Float32) as u32, 0), 0)?,
            (Float32, Float64) => {}
            (Float64, Float32) => self.push(Instr::new(op::F2F32, 0, 0), 0)?,
            (f, Decimal128(_, s)) if is_integer(f) => {
                let scale = pow10(*s).ok_or_else(|| format!("a cast to {to}"))?;
                self.push(Instr::new(op::SCALE_I, range_of(to).expect("decimal"), scale), 0)?;
            }
            (Decimal128(_, s1), Decimal128(_, s2)) if s2 >= s1 && *s1 >= 0 => {
                // Widening keeps the value; a larger scale multiplies it (checked).
                let scale = pow10(s2 - s1).ok_or_else(|| format!("a cast to {to}"))?;
                self.push(Instr::new(op::SCALE_I, range_of(to).expect("decimal"), scale), 0)?;
            }
            (Decimal128(_, s), Float32 | Float64) if *s >= 0 => {
                let scale = pow10(*s).ok_or_else(|| format!("a cast from {from}"))?;
                self.push(Instr::new(op::DEC2F, (*to == Float32) as u32, scale), 0)?;
            }
            _ => return no(),
        }
        Ok(to.clone())
    }
}

/// The value of an expression without columns.
fn constant(e: &Arc<dyn PhysicalExpr>) -> Result<ScalarValue, String> {
    let options = datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(1));
    let one_row =
        RecordBatch::try_new_with_options(Arc::new(Schema::empty()), vec![], &options).map_err(|e| e.to_string())?;
    let v = e.evaluate(&one_row).map_err(|err| format!("the constant `{e}` fails: {err}"))?;
    match v {
        datafusion::logical_expr::ColumnarValue::Scalar(s) => Ok(s),
        datafusion::logical_expr::ColumnarValue::Array(a) => {
            ScalarValue::try_from_array(&a, 0).map_err(|e| e.to_string())
        }
    }
}

/// The result type of integer / float / decimal arithmetic, as Arrow computes
/// it without rescaling (anything needing a rescale does not compile).
fn binary_type(lt: &DataType, rt: &DataType, o: Operator) -> Result<DataType, String> {
    use DataType::*;
    match (lt, rt) {
        (a, b) if a == b && (is_integer(a) || is_float(a)) => Ok(a.clone()),
        (Decimal128(p1, s1), Decimal128(p2, s2)) if *s1 >= 0 && *s2 >= 0 => {
            let (p1, s1, p2, s2) = (*p1 as i32, *s1 as i32, *p2 as i32, *s2 as i32);
            let (p, s) = match o {
                Operator::Multiply => (p1 + p2 + 1, s1 + s2),
                _ if s1 == s2 => ((p1 - s1).max(p2 - s2) + s1 + 1, s1),
                _ => return Err(format!("{lt} {o} {rt} (a rescale)")),
            };
            Ok(Decimal128(p.min(38) as u8, s as i8))
        }
        _ => Err(format!("{lt} {o} {rt}")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{
        Array, ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array, Int16Array,
        Int32Array, Int64Array, Int8Array, RecordBatch, UInt32Array,
    };
    use datafusion::arrow::datatypes::{Field, Schema};
    use datafusion::common::DFSchema;
    use datafusion::prelude::SessionContext;

    use super::*;
    use crate::algo::join_filter::{facts_cpu, tests_data::Rng, PairColumn, PairJoin, NONEMPTY};

    /// Random rows of every readable type, NULLs and float specials included.
    fn batch(rng: &mut Rng, n: usize, extremes: bool) -> RecordBatch {
        let null = |r: &mut Rng| r.below(8) == 0;
        let opt = |r: &mut Rng, v: i64| if null(r) { None } else { Some(v) };
        let rare = if extremes { 10 } else { u64::MAX };
        let specials = [f64::NAN, -0.0, 0.0, f64::INFINITY, 1e300, -1.5, -f64::NAN];
        let cols: Vec<(&str, ArrayRef)> = vec![
            ("i8", Arc::new(Int8Array::from_iter((0..n).map(|_| opt(rng, 0).map(|_| rng.next_u64() as i8))))),
            (
                "i16",
                Arc::new(Int16Array::from_iter((0..n).map(|_| opt(rng, 0).map(|_| rng.below(2000) as i16 - 1000)))),
            ),
            (
                "i32",
                Arc::new(Int32Array::from_iter((0..n).map(|_| {
                    opt(rng, 0).map(|_| {
                        if rng.below(rare) == 0 {
                            [i32::MAX, i32::MIN, 0][rng.below(3) as usize]
                        } else {
                            rng.below(200) as i32 - 100
                        }
                    })
                }))),
            ),
            (
                "i64",
                Arc::new(Int64Array::from_iter((0..n).map(|_| {
                    opt(rng, 0).map(|_| {
                        if rng.below(rare) == 0 {
                            [i64::MAX, i64::MIN][rng.below(2) as usize]
                        } else {
                            rng.below(200) as i64 - 100
                        }
                    })
                }))),
            ),
            (
                "u32",
                Arc::new(UInt32Array::from_iter((0..n).map(|_| {
                    opt(rng, 0).map(|_| if extremes { rng.next_u64() as u32 } else { rng.below(1000) as u32 })
                }))),
            ),
            (
                "f32",
                Arc::new(Float32Array::from_iter(
                    (0..n).map(|_| opt(rng, 0).map(|_| (rng.below(2000) as f32 - 1000.0) / 7.0)),
                )),
            ),
            (
                "f64",
                Arc::new(Float64Array::from_iter((0..n).map(|_| {
                    opt(rng, 0).map(|_| {
                        if rng.below(5) == 0 {
                            specials[rng.below(7) as usize]
                        } else {
                            (rng.below(2000) as f64 - 1000.0) / 3.0
                        }
                    })
                }))),
            ),
            (
                "d",
                Arc::new(
                    Decimal128Array::from_iter(
                        (0..n).map(|_| opt(rng, 0).map(|_| rng.below(200_000) as i128 - 100_000)),
                    )
                    .with_precision_and_scale(10, 2)
                    .unwrap(),
                ),
            ),
            ("b", Arc::new(BooleanArray::from_iter((0..n).map(|_| opt(rng, 0).map(|_| rng.below(2) == 0))))),
            (
                "day",
                Arc::new(Date32Array::from_iter((0..n).map(|_| opt(rng, 0).map(|_| 18000 + rng.below(1000) as i32)))),
            ),
        ];
        let fields: Vec<Field> = cols.iter().map(|(name, a)| Field::new(*name, a.data_type().clone(), true)).collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols.into_iter().map(|(_, a)| a).collect()).unwrap()
    }

    /// Every filter that compiles gives DataFusion's own answer, row by row
    /// (here each row is a pair: all columns are the probe's, one build row).
    #[tokio::test]
    async fn compiled_filters_match_datafusion() {
        let mut rng = Rng(2026);
        let batches = [batch(&mut rng, 3000, true), batch(&mut rng, 3000, false)];
        let ctx = SessionContext::new();
        let mut compiled = 0;
        let mut decided = 0;
        for b in &batches {
            let df_schema = DFSchema::try_from(b.schema().as_ref().clone()).unwrap();
            let filters = [
                "i64 <> i32",
                "f64 < f32 * 2",
                "d + d > 10.5",
                "d * d >= d",
                "i32 + i32 * 3 - i16 > 0 OR b IS NULL",
                "NOT b AND i8 < 5",
                "day > DATE '2021-06-01' AND day <= DATE '2022-01-01'",
                "u32 > 4000000000",
                "-i64 < i32",
                "CAST(d AS DOUBLE) > f64",
                "CAST(d AS FLOAT) > f32",
                "i32 * 100000 > i32",
                "i64 + 1 > i64",
                "f32 + f32 = f32 OR f32 - f32 <> 0",
                "i64 > 2 AND (f64 = f64 OR f64 IS NULL)",
                // -0.0 = 0.0, a NaN with the sign bit below everything
                "f64 = -f64",
                "-f64 < f64 OR f64 * 0 >= f64",
                "TRY_CAST(i64 AS INT) > 5",
                "CAST(i32 AS DECIMAL(12, 3)) > d",
                "CAST(i64 AS SMALLINT) < i16",
                "CAST(i32 AS REAL) >= f32",
                "CAST(i64 AS DOUBLE) / 2 < f64",
                "f64 / f64 > 1 OR f32 / f32 < 0.5",
                "i32 / 3 > i8",
                "f64 * 2.5 - 1 >= -f64",
                "i8 IS NOT NULL AND (b OR i16 > 0)",
                "CAST(u32 AS BIGINT) - i64 > 1000",
                "d - CAST(i8 AS DECIMAL(10, 2)) < 0",
            ];
            for sql in filters {
                let expr = ctx.parse_sql_expr(sql, &df_schema).unwrap();
                let physical = ctx.create_physical_expr(expr, &df_schema).unwrap();
                let filter = PairFilter {
                    expr: physical.clone(),
                    columns: (0..b.num_columns()).map(|i| (true, i)).collect(),
                    schema: b.schema(),
                };
                let programs = match compile(&filter, None) {
                    Ok(p) => p,
                    Err(why) => {
                        eprintln!("`{sql}` ({physical}) stays on the host: {why}");
                        continue;
                    }
                };
                let columns: Vec<PairColumn> =
                    b.columns().iter().map(|c| PairColumn::new(true, &[c.clone()]).unwrap()).collect();
                let j = PairJoin { keys: None, n: b.num_rows(), nb: 1, columns: &columns, programs: &programs };
                compiled += 1;
                let Some(facts) = facts_cpu(&j).unwrap() else {
                    // Checked overflow: the operator evaluates DataFusion's expression instead.
                    eprintln!("`{sql}` overflowed: the host decides");
                    continue;
                };
                let want = physical.evaluate(b).unwrap().into_array(b.num_rows());
                let want = match want {
                    Ok(a) => a,
                    Err(e) => panic!("`{sql}`: DataFusion failed ({e}) where the device did not overflow"),
                };
                let want = want.as_any().downcast_ref::<BooleanArray>().unwrap();
                for r in 0..b.num_rows() {
                    let passes = want.is_valid(r) && want.value(r);
                    assert_eq!(facts[r] & NONEMPTY != 0, passes, "`{sql}` ({physical}) on row {r}");
                }
                decided += 1;
            }
        }
        assert!(
            compiled >= 2 * 20 && decided >= 2 * 14 + 6,
            "{compiled} filters compiled, {decided} decided on the device"
        );
    }
}
