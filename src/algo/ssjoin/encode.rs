//! Arrow list columns -> sets of u64 element keys (shared by the SQL
//! functions and the similarity join operator).
//!
//! Integers are keyed by value (signed types via Int64, all-unsigned inputs via
//! UInt64); strings (Utf8, LargeUtf8, Utf8View) are dictionary-encoded with
//! one dictionary across all the columns encoded together, so equal strings
//! get equal keys exactly (no hashing). NULL elements are dropped; a NULL list
//! is reported through `valid`.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type, UInt64Type};
use datafusion::error::{DataFusionError, Result};

use crate::algo::ssjoin::RawSets;

/// What a list's elements are compared as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElementClass {
    /// A list of NULLs (e.g. an empty `make_array()`): compatible with any class.
    Null,
    Signed,
    Unsigned,
    String,
}

/// The element type of a set-valued column, or None if the type is not a list
/// (`DataType::Null`, a NULL literal, counts as a list of NULLs).
pub fn element_type(dt: &DataType) -> Option<&DataType> {
    match dt {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => Some(f.data_type()),
        DataType::Null => Some(&DataType::Null),
        _ => None,
    }
}

fn class_of(dt: &DataType) -> Option<ElementClass> {
    use DataType::*;
    match dt {
        Null => Some(ElementClass::Null),
        Int8 | Int16 | Int32 | Int64 => Some(ElementClass::Signed),
        UInt8 | UInt16 | UInt32 | UInt64 => Some(ElementClass::Unsigned),
        Utf8 | LargeUtf8 | Utf8View => Some(ElementClass::String),
        Dictionary(_, v) => class_of(v),
        _ => None,
    }
}

/// The common element class of set-valued arguments, or a plan error naming
/// `func` that explains what is accepted.
pub fn common_class(func: &str, types: &[DataType]) -> Result<ElementClass> {
    let mut class = ElementClass::Null;
    for dt in types {
        let el = element_type(dt).ok_or_else(|| {
            DataFusionError::Plan(format!(
                "{func}: arguments must be lists (List, LargeList or FixedSizeList) of integers or strings, got {dt}"
            ))
        })?;
        let c = class_of(el).ok_or_else(|| {
            DataFusionError::Plan(format!("{func}: list elements must be integers or strings, got {el}"))
        })?;
        class = match (class, c) {
            (ElementClass::Null, c) | (c, ElementClass::Null) => c,
            (ElementClass::Signed, ElementClass::Unsigned) | (ElementClass::Unsigned, ElementClass::Signed) => {
                ElementClass::Signed
            }
            (a, b) if a == b => a,
            _ => {
                return Err(DataFusionError::Plan(format!(
                    "{func}: cannot compare list elements of types {} and {el}",
                    types
                        .iter()
                        .map(|t| element_type(t).map(|e| e.to_string()).unwrap_or_default())
                        .collect::<Vec<_>>()
                        .join(" and ")
                )))
            }
        };
    }
    Ok(class)
}

/// One encoded column: the raw (unsorted, possibly duplicated) element keys
/// per row, and which rows hold a non-NULL list.
#[derive(Debug, Clone, Default)]
pub struct EncodedSets {
    pub sets: RawSets,
    pub valid: Vec<bool>,
}

/// Encode set-valued columns with one shared key space.
pub fn encode(func: &str, arrays: &[ArrayRef]) -> Result<Vec<EncodedSets>> {
    let types: Vec<DataType> = arrays.iter().map(|a| a.data_type().clone()).collect();
    let class = common_class(func, &types)?;
    let mut dict: HashMap<String, u64> = HashMap::new();
    arrays.iter().map(|a| encode_one(a, class, &mut dict)).collect()
}

fn encode_one(array: &ArrayRef, class: ElementClass, dict: &mut HashMap<String, u64>) -> Result<EncodedSets> {
    let n = array.len();
    let Some((values, ranges)) = crate::keys::list_parts(array)? else {
        return Ok(EncodedSets { sets: RawSets { offsets: vec![0; n + 1], elems: vec![] }, valid: vec![false; n] });
    };
    // Element keys, and which elements are NULL (None: none is).
    let (keys, nulls): (Vec<u64>, Option<datafusion::arrow::buffer::NullBuffer>) =
        if values.data_type() == &DataType::Null || class == ElementClass::Null {
            (vec![0; values.len()], Some(datafusion::arrow::buffer::NullBuffer::new_null(values.len())))
        } else {
            match class {
                ElementClass::Null => unreachable!("handled above"),
                ElementClass::Signed => {
                    let v = cast(&values, &DataType::Int64)?;
                    let p = v.as_primitive::<Int64Type>();
                    (p.values().iter().map(|x| *x as u64).collect(), p.nulls().cloned())
                }
                ElementClass::Unsigned => {
                    let v = cast(&values, &DataType::UInt64)?;
                    let p = v.as_primitive::<UInt64Type>();
                    (p.values().to_vec(), p.nulls().cloned())
                }
                ElementClass::String => {
                    let v = cast(&values, &DataType::LargeUtf8)?;
                    let a = v.as_string::<i64>();
                    let keys = (0..a.len())
                        .map(|i| {
                            if a.is_null(i) {
                                return 0;
                            }
                            let s = a.value(i);
                            match dict.get(s) {
                                Some(k) => *k,
                                None => {
                                    let k = dict.len() as u64;
                                    dict.insert(s.to_owned(), k);
                                    k
                                }
                            }
                        })
                        .collect();
                    (keys, a.nulls().cloned())
                }
            }
        };
    let nulls = nulls.filter(|n| n.null_count() > 0);
    let mut sets = RawSets { offsets: Vec::with_capacity(n + 1), elems: Vec::with_capacity(keys.len()) };
    sets.offsets.push(0);
    let mut valid = Vec::with_capacity(n);
    for (i, (s, e)) in ranges.into_iter().enumerate() {
        let ok = array.is_valid(i);
        valid.push(ok);
        if ok {
            match &nulls {
                // Whole rows at a time: the common case is a plain copy.
                None => sets.elems.extend_from_slice(&keys[s..e]),
                Some(nb) => sets.elems.extend((s..e).filter(|&j| nb.is_valid(j)).map(|j| keys[j])),
            }
        }
        sets.offsets.push(sets.elems.len());
    }
    Ok(EncodedSets { sets, valid })
}

/// A shared empty list type for tokenizers: `List<Utf8>` with a nullable "item" field.
pub fn string_list_type() -> DataType {
    DataType::List(Arc::new(datafusion::arrow::datatypes::Field::new("item", DataType::Utf8, true)))
}
