//! `setfusion_unpruned(predicate)`: the predicate itself, hidden from
//! pruning by statistics.
//!
//! Parquet leaves NaN out of a float column's min / max, while DataFusion
//! orders NaN above every number (and the NaN with the sign bit below every
//! number); DataFusion 55.2's Parquet scan still drops row groups, pages and
//! files by those bounds (apache/datafusion#15812). Its pruning cannot see
//! into an unknown function, so a conjunct of a scan's predicate wrapped in
//! this one prunes nothing, while it filters rows exactly as before
//! (`planner::float_statistics` wraps those that read a float column).

use datafusion::arrow::datatypes::DataType;
use datafusion::error::Result;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility};

pub const NAME: &str = "setfusion_unpruned";

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct UnprunedUdf {
    signature: Signature,
}

impl UnprunedUdf {
    pub fn new() -> Self {
        Self { signature: Signature::exact(vec![DataType::Boolean], Volatility::Immutable) }
    }
}

impl Default for UnprunedUdf {
    fn default() -> Self {
        Self::new()
    }
}

impl ScalarUDFImpl for UnprunedUdf {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(&self, mut args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        Ok(args.args.swap_remove(0))
    }
}
