//! SQL functions for sets and text:
//!
//! | function | result |
//! | --- | --- |
//! | `jaccard(a, b)` | Float64, \|a ∩ b\| / \|a ∪ b\| |
//! | `dice(a, b)` | Float64, 2 \|a ∩ b\| / (\|a\| + \|b\|) |
//! | `set_cosine(a, b)` | Float64, \|a ∩ b\| / sqrt(\|a\| \|b\|) |
//! | `overlap(a, b)` | Int64, \|a ∩ b\| |
//! | `tokenize(text)` | List<Utf8>, lower-cased word tokens (runs of alphanumeric characters), in order |
//! | `qgrams(text, q)` | List<Utf8>, the character q-grams of `text` in order (no padding; a non-empty text shorter than q gives itself) |
//! | `set_intersect_all(a, b)` | List, multiset a ∩ b: min(m, n) copies of a value with m copies in a, n in b, sorted |
//! | `set_except_all(a, b)` | List, multiset a − b: max(m − n, 0) copies, sorted |
//! | `set_union_all(a, b)` | List, multiset a ∪ b: max(m, n) copies, sorted |
//! | `set_symmetric_difference(a, b)` | List, \|m − n\| copies, sorted |
//! | `sorted_intersect(a, b)` | List, like `set_intersect_all` for ascending lists (an unsorted list is an error) |
//! | `set_intersect_agg(list)` (aggregate) | List, min-count intersection of a group's non-NULL lists, sorted (NULL if none) |
//!
//! The multiset functions (`set_*_all`, `set_symmetric_difference`,
//! `sorted_intersect`, `set_intersect_agg`) keep duplicates; their rules
//! (NULL elements ignored, NULL list gives NULL, result element type) are in
//! [`multiset`].
//!
//! Arguments of the similarity functions are List, LargeList or FixedSizeList columns
//! of integers or strings, both sides of the same kind. Semantics:
//! * lists are sets: duplicates inside a list are removed;
//! * NULL elements are ignored; a NULL list gives NULL;
//! * **empty sets**: when a denominator is zero (two empty sets for jaccard
//!   and dice; any empty set for set_cosine) the value is **0.0** — empty sets
//!   share no element, so they are never "similar", and a similarity join
//!   (threshold > 0) never pairs an empty set. `overlap` of empty sets is 0.
//!
//! The metric values are computed by [`crate::algo::ssjoin::Metric::value`],
//! the very expression both join backends use, so a join's result equals the
//! nested-loop evaluation of the same predicate bit for bit.

pub mod families;
pub mod float_order;
pub mod multiset;
pub mod unpruned;
/// The list encoding moved to `algo::ssjoin::encode` (below the operators that use it).
pub use crate::algo::ssjoin::encode as sets;

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Builder, Int64Builder, ListBuilder, StringBuilder};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

use crate::algo::ssjoin::Metric;
use crate::algo::ssjoin_prep::dedup_sets;

/// Every setfusion scalar function (registered by [`crate::install`]).
pub fn functions() -> Vec<Arc<ScalarUDF>> {
    vec![
        Arc::new(ScalarUDF::from(SimilarityUdf::new(Metric::Jaccard))),
        Arc::new(ScalarUDF::from(SimilarityUdf::new(Metric::Dice))),
        Arc::new(ScalarUDF::from(SimilarityUdf::new(Metric::Cosine))),
        Arc::new(ScalarUDF::from(SimilarityUdf::new(Metric::Overlap))),
        Arc::new(ScalarUDF::from(TokenizeUdf::new())),
        Arc::new(ScalarUDF::from(QgramsUdf::new())),
        Arc::new(ScalarUDF::from(float_order::FloatOrderUdf::new())),
        Arc::new(ScalarUDF::from(unpruned::UnprunedUdf::new())),
    ]
    .into_iter()
    .chain(multiset::scalar_functions())
    .collect()
}

/// Every setfusion aggregate function (registered by [`crate::install`]).
pub fn aggregate_functions() -> Vec<Arc<datafusion::logical_expr::AggregateUDF>> {
    multiset::aggregate_functions()
}

/// `jaccard`, `dice`, `set_cosine`, `overlap`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SimilarityUdf {
    metric: Metric,
    signature: Signature,
}

impl SimilarityUdf {
    pub fn new(metric: Metric) -> Self {
        Self { metric, signature: Signature::any(2, Volatility::Immutable) }
    }
    pub fn metric(&self) -> Metric {
        self.metric
    }
}

impl ScalarUDFImpl for SimilarityUdf {
    fn name(&self) -> &str {
        self.metric.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        sets::common_class(self.name(), arg_types)?;
        Ok(if self.metric == Metric::Overlap { DataType::Int64 } else { DataType::Float64 })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let arrays: Vec<Vec<ArrayRef>> = args.args.iter().map(|a| Ok(vec![a.to_array(n)?])).collect::<Result<_>>()?;
        let enc = sets::encode(self.name(), &arrays)?;
        let (a, b) = (&enc[0], &enc[1]);
        let (da, db) = (dedup_sets(&a.sets), dedup_sets(&b.sets));
        let value = |i: usize| -> Option<(u64, u64, u64)> {
            if !a.valid[i] || !b.valid[i] {
                return None;
            }
            let (x, y) = (da.set(i), db.set(i));
            Some((intersection_size(x, y), x.len() as u64, y.len() as u64))
        };
        let out: ArrayRef = if self.metric == Metric::Overlap {
            let mut bld = Int64Builder::with_capacity(n);
            for i in 0..n {
                bld.append_option(value(i).map(|(o, _, _)| o as i64));
            }
            Arc::new(bld.finish())
        } else {
            let mut bld = Float64Builder::with_capacity(n);
            for i in 0..n {
                bld.append_option(value(i).map(|(o, x, y)| self.metric.value(o, x, y)));
            }
            Arc::new(bld.finish())
        };
        Ok(ColumnarValue::Array(out))
    }
}

/// |x ∩ y| of two sorted, deduplicated slices.
pub fn intersection_size(x: &[u64], y: &[u64]) -> u64 {
    let (mut i, mut j, mut o) = (0, 0, 0u64);
    while i < x.len() && j < y.len() {
        match x[i].cmp(&y[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                o += 1;
                i += 1;
                j += 1;
            }
        }
    }
    o
}

/// Lower-cased word tokens: maximal runs of alphanumeric characters.
pub fn word_tokens(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(|w| w.to_lowercase()).collect()
}

/// Character q-grams in order, without padding; a non-empty text shorter than
/// `q` gives itself; the empty text gives none. `q` must be at least 1.
pub fn qgram_tokens(text: &str, q: usize) -> Vec<String> {
    assert!(q >= 1, "q must be at least 1");
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return Vec::new();
    }
    if chars.len() < q {
        return vec![text.to_string()];
    }
    chars.windows(q).map(|w| w.iter().collect()).collect()
}

fn string_array(func: &str, a: &ArrayRef) -> Result<ArrayRef> {
    match a.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null | DataType::Dictionary(_, _) => {
            Ok(cast(a, &DataType::LargeUtf8)?)
        }
        other => Err(DataFusionError::Plan(format!("{func}: expected a string argument, got {other}"))),
    }
}

fn check_string(func: &str, dt: &DataType) -> Result<()> {
    match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null => Ok(()),
        DataType::Dictionary(_, v)
            if matches!(v.as_ref(), DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) =>
        {
            Ok(())
        }
        other => Err(DataFusionError::Plan(format!("{func}: expected a string argument, got {other}"))),
    }
}

/// `tokenize(text)`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TokenizeUdf {
    signature: Signature,
}

impl TokenizeUdf {
    pub fn new() -> Self {
        Self { signature: Signature::any(1, Volatility::Immutable) }
    }
}

impl Default for TokenizeUdf {
    fn default() -> Self {
        Self::new()
    }
}

impl ScalarUDFImpl for TokenizeUdf {
    fn name(&self) -> &str {
        "tokenize"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        check_string("tokenize", &arg_types[0])?;
        Ok(sets::string_list_type())
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let text = string_array("tokenize", &args.args[0].to_array(n)?)?;
        let text = text.as_string::<i64>();
        let mut bld = ListBuilder::new(StringBuilder::new());
        for t in text.iter() {
            match t {
                None => bld.append(false),
                Some(t) => {
                    for w in word_tokens(t) {
                        bld.values().append_value(w);
                    }
                    bld.append(true);
                }
            }
        }
        Ok(ColumnarValue::Array(Arc::new(bld.finish())))
    }
}

/// `qgrams(text, q)`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct QgramsUdf {
    signature: Signature,
}

impl QgramsUdf {
    pub fn new() -> Self {
        Self { signature: Signature::any(2, Volatility::Immutable) }
    }
}

impl Default for QgramsUdf {
    fn default() -> Self {
        Self::new()
    }
}

impl ScalarUDFImpl for QgramsUdf {
    fn name(&self) -> &str {
        "qgrams"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        check_string("qgrams", &arg_types[0])?;
        if !(arg_types[1].is_integer() || arg_types[1] == DataType::Null) {
            return Err(DataFusionError::Plan(format!("qgrams: q must be an integer, got {}", arg_types[1])));
        }
        Ok(sets::string_list_type())
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let text = string_array("qgrams", &args.args[0].to_array(n)?)?;
        let text = text.as_string::<i64>();
        let q = cast(&args.args[1].to_array(n)?, &DataType::Int64)?;
        let q = q.as_primitive::<Int64Type>();
        let mut bld = ListBuilder::new(StringBuilder::new());
        for i in 0..n {
            if text.is_null(i) || q.is_null(i) {
                bld.append(false);
                continue;
            }
            let qi = q.value(i);
            if qi < 1 {
                return Err(DataFusionError::Execution(format!("qgrams: q must be at least 1, got {qi}")));
            }
            for g in qgram_tokens(text.value(i), qi as usize) {
                bld.values().append_value(g);
            }
            bld.append(true);
        }
        Ok(ColumnarValue::Array(Arc::new(bld.finish())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizers() {
        assert_eq!(word_tokens("Hello, World! x2-y"), vec!["hello", "world", "x2", "y"]);
        assert_eq!(qgram_tokens("abcd", 3), vec!["abc", "bcd"]);
        assert_eq!(qgram_tokens("ab", 3), vec!["ab"]);
        assert!(qgram_tokens("", 3).is_empty());
        assert_eq!(qgram_tokens("héllo", 4), vec!["héll", "éllo"]);
    }
}
