//! `setfusion_float_order(x)`: a DOUBLE's place in DataFusion's order as a
//! BIGINT. DataFusion compares floats in IEEE's total order once -0.0 is
//! made 0.0 (`-0.0 = 0.0`; a NaN equals only a NaN of the same bits; the NaN
//! with the sign bit is below every number, the others above), but its
//! grouped `min` / `max` compare with IEEE's `<`, so over NaNs they answer
//! by the order of the rows. The quantified comparisons' summaries
//! (`planner::quantified`) take `min` / `max` of this key instead: two keys
//! compare as DataFusion compares their doubles.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

pub const NAME: &str = "setfusion_float_order";

/// The key of one double: equal keys for values DataFusion holds equal, and
/// keys ordered as it orders the values.
pub fn float_order_key(v: f64) -> i64 {
    crate::util::double_order_key(v.to_bits())
}

/// `setfusion_float_order(e)` (`e` a DOUBLE).
pub fn float_order(e: Expr) -> Expr {
    ScalarUDF::from(FloatOrderUdf::new()).call(vec![e])
}

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FloatOrderUdf {
    signature: Signature,
}

impl FloatOrderUdf {
    pub fn new() -> Self {
        Self { signature: Signature::exact(vec![DataType::Float64], Volatility::Immutable) }
    }
}

impl Default for FloatOrderUdf {
    fn default() -> Self {
        Self::new()
    }
}

impl ScalarUDFImpl for FloatOrderUdf {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let values = args.args[0].to_array(args.number_rows)?;
        let keys = values.as_primitive::<Float64Type>().unary::<_, Int64Type>(float_order_key);
        Ok(ColumnarValue::Array(Arc::new(keys) as ArrayRef))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys order as `f64::total_cmp` after -0.0 is made 0.0.
    #[test]
    fn keys_order_as_datafusion_compares() {
        let v = [
            -f64::NAN,
            f64::NEG_INFINITY,
            -1.5,
            -f64::MIN_POSITIVE,
            -0.0,
            0.0,
            5e-324,
            2.0,
            f64::INFINITY,
            f64::NAN,
            f64::from_bits(f64::NAN.to_bits() | 1),
        ];
        for x in v {
            for y in v {
                let (nx, ny) = (if x == 0.0 { 0.0 } else { x }, if y == 0.0 { 0.0 } else { y });
                assert_eq!(float_order_key(x).cmp(&float_order_key(y)), nx.total_cmp(&ny), "{x:?} {y:?}");
            }
        }
    }
}
