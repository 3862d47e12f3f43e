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
                let elements: Vec<String> =
                    types.iter().map(|t| element_type(t).map(|e| e.to_string()).unwrap_or_default()).collect();
                return Err(DataFusionError::Plan(format!(
                    "{func}: cannot compare list elements of types {}",
                    elements.join(" and ")
                )));
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

/// Encode set-valued columns with one shared key space. Each column may come
/// in chunks (its input's batches, in order), encoded as one column: the
/// batches need not be concatenated first (a copy of every element).
pub fn encode(func: &str, columns: &[Vec<ArrayRef>]) -> Result<Vec<EncodedSets>> {
    let types: Vec<DataType> = columns.iter().flatten().map(|a| a.data_type().clone()).collect();
    let class = common_class(func, &types)?;
    let mut dict: HashMap<String, u64> = HashMap::new();
    columns.iter().map(|chunks| encode_column(chunks, class, &mut dict)).collect()
}

/// One chunk's element keys (UInt64 values read where they lie, others
/// mapped once), which elements are NULL, and each row's range of them.
struct ChunkKeys {
    array: ArrayRef,
    keys: Keys,
    nulls: Option<datafusion::arrow::buffer::NullBuffer>,
    ranges: Vec<(usize, usize)>,
}

enum Keys {
    Owned(Vec<u64>),
    InPlace(ArrayRef),
}

impl ChunkKeys {
    fn keys(&self) -> &[u64] {
        match &self.keys {
            Keys::Owned(v) => v,
            Keys::InPlace(a) => a.as_primitive::<UInt64Type>().values(),
        }
    }

    /// No NULL list or element, and rows one after another in the values (a
    /// column as read): its sets are one slice of its keys.
    fn contiguous(&self) -> bool {
        self.nulls.is_none() && self.array.logical_null_count() == 0 && self.ranges.windows(2).all(|w| w[0].1 == w[1].0)
    }

    /// Is row `i` a list (a NULL column's rows are NULL lists)?
    fn row_valid(&self, i: usize) -> bool {
        self.array.data_type() != &DataType::Null && self.array.is_valid(i)
    }

    fn span(&self) -> &[u64] {
        let (first, last) = (self.ranges.first().map_or(0, |r| r.0), self.ranges.last().map_or(0, |r| r.1));
        &self.keys()[first..last]
    }
}

fn chunk_keys(array: &ArrayRef, class: ElementClass, dict: &mut HashMap<String, u64>) -> Result<ChunkKeys> {
    let n = array.len();
    let Some((values, ranges)) = crate::keys::list_parts(array)? else {
        // A NULL column: every row a NULL list.
        return Ok(ChunkKeys { array: array.clone(), keys: Keys::Owned(vec![]), nulls: None, ranges: vec![(0, 0); n] });
    };
    let (keys, nulls) = if values.data_type() == &DataType::Null || class == ElementClass::Null {
        (Keys::Owned(vec![0; values.len()]), Some(datafusion::arrow::buffer::NullBuffer::new_null(values.len())))
    } else {
        match class {
            ElementClass::Null => unreachable!("handled above"),
            ElementClass::Signed => {
                let v = cast(&values, &DataType::Int64)?;
                let p = v.as_primitive::<Int64Type>();
                (Keys::Owned(p.values().iter().map(|x| *x as u64).collect()), p.nulls().cloned())
            }
            ElementClass::Unsigned => {
                let unsigned = cast(&values, &DataType::UInt64)?;
                let nulls = unsigned.as_primitive::<UInt64Type>().nulls().cloned();
                (Keys::InPlace(unsigned), nulls)
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
                (Keys::Owned(keys), a.nulls().cloned())
            }
        }
    };
    let nulls = nulls.filter(|n| n.null_count() > 0);
    Ok(ChunkKeys { array: array.clone(), keys, nulls, ranges })
}

fn encode_column(chunks: &[ArrayRef], class: ElementClass, dict: &mut HashMap<String, u64>) -> Result<EncodedSets> {
    let chunks = chunks.iter().map(|a| chunk_keys(a, class, dict)).collect::<Result<Vec<_>>>()?;
    let rows: usize = chunks.iter().map(|c| c.ranges.len()).sum();
    // Every chunk's sets one slice of its keys: the sets are one copy of those
    // slices, on the host's threads (a 100k-set collection's two copies on one
    // thread took ~30 ms).
    if chunks.iter().all(ChunkKeys::contiguous) {
        let spans: Vec<&[u64]> = chunks.iter().map(ChunkKeys::span).collect();
        let mut elems = vec![0u64; spans.iter().map(|s| s.len()).sum()];
        crate::host::parallel_gather(&spans, &mut elems, crate::host::copy_threads(), &|_| {});
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        let mut base = 0;
        for c in &chunks {
            let first = c.ranges.first().map_or(0, |r| r.0);
            offsets.extend(c.ranges.iter().map(|r| base + r.1 - first));
            base += c.span().len();
        }
        return Ok(EncodedSets { sets: RawSets { offsets, elems }, valid: vec![true; rows] });
    }
    let total: usize = chunks.iter().map(|c| c.keys().len()).sum();
    let mut sets = RawSets { offsets: Vec::with_capacity(rows + 1), elems: Vec::with_capacity(total) };
    sets.offsets.push(0);
    let mut valid = Vec::with_capacity(rows);
    for c in &chunks {
        let keys = c.keys();
        for (i, &(s, e)) in c.ranges.iter().enumerate() {
            let ok = c.row_valid(i);
            valid.push(ok);
            if ok {
                match &c.nulls {
                    // Whole rows at a time: the common case is a plain copy.
                    None => sets.elems.extend_from_slice(&keys[s..e]),
                    Some(nb) => sets.elems.extend((s..e).filter(|&j| nb.is_valid(j)).map(|j| keys[j])),
                }
            }
            sets.offsets.push(sets.elems.len());
        }
    }
    Ok(EncodedSets { sets, valid })
}

/// A shared empty list type for tokenizers: `List<Utf8>` with a nullable "item" field.
pub fn string_list_type() -> DataType {
    DataType::List(Arc::new(datafusion::arrow::datatypes::Field::new("item", DataType::Utf8, true)))
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::ListArray;
    use datafusion::arrow::datatypes::{Int32Type, UInt64Type};

    use super::*;

    type Rows = Vec<Option<Vec<Option<u64>>>>;

    /// The sets a column's rows hold: offsets, elements (NULL elements
    /// dropped), and which rows are lists (a NULL list is an empty set).
    fn sets_of(rows: &Rows) -> (Vec<usize>, Vec<u64>, Vec<bool>) {
        let (mut offsets, mut elems) = (vec![0], Vec::new());
        for r in rows {
            elems.extend(r.iter().flatten().flatten());
            offsets.push(elems.len());
        }
        (offsets, elems, rows.iter().map(Option::is_some).collect())
    }

    /// Each row's elements in order, on the one-copy path (no NULLs, rows
    /// one after another, a slice of a column too) and row by row (NULL
    /// lists, NULL elements), from UBIGINT and INT lists.
    #[test]
    fn sets_are_the_rows_elements() {
        let some = |v: &[u64]| Some(v.iter().map(|&x| Some(x)).collect::<Vec<_>>());
        let plain: Rows = vec![some(&[3, 1]), some(&[]), some(&[7]), some(&[2, 2, 9]), some(&[5])];
        let mut null_list = plain.clone();
        null_list[2] = None;
        let mut null_element = plain.clone();
        null_element[3] = Some(vec![Some(2), None, Some(9)]);
        for rows in [plain, null_list, null_element] {
            let unsigned: ArrayRef = Arc::new(ListArray::from_iter_primitive::<UInt64Type, _, _>(rows.clone()));
            let signed: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(
                rows.iter().map(|r| r.as_ref().map(|v| v.iter().map(|x| x.map(|x| x as i32)).collect::<Vec<_>>())),
            ));
            for array in [unsigned, signed] {
                let e = &encode("test", &[vec![array.clone()]]).unwrap()[0];
                let (offsets, elems, valid) = sets_of(&rows);
                assert_eq!((&e.sets.offsets, &e.sets.elems, &e.valid), (&offsets, &elems, &valid), "{rows:?}");
                // Rows 1..4 alone: their ranges start inside the values.
                let e = &encode("test", &[vec![array.slice(1, 3)]]).unwrap()[0];
                let (offsets, elems, valid) = sets_of(&rows[1..4].to_vec());
                assert_eq!((&e.sets.offsets, &e.sets.elems, &e.valid), (&offsets, &elems, &valid), "{rows:?} sliced");
                // The column in chunks (a batch per partition), one of them empty: one column's sets.
                let chunks = vec![array.slice(0, 2), array.slice(2, 0), array.slice(2, 1), array.slice(3, 2)];
                let e = &encode("test", &[chunks]).unwrap()[0];
                let (offsets, elems, valid) = sets_of(&rows);
                assert_eq!((&e.sets.offsets, &e.sets.elems, &e.valid), (&offsets, &elems, &valid), "{rows:?} chunked");
            }
        }
        // A NULL column's rows are NULL lists, beside a chunk of lists.
        let array: ArrayRef = Arc::new(ListArray::from_iter_primitive::<UInt64Type, _, _>(vec![some(&[4, 2])]));
        let null: ArrayRef = Arc::new(datafusion::arrow::array::NullArray::new(2));
        let e = &encode("test", &[vec![null.clone(), array]]).unwrap()[0];
        assert_eq!(
            (&e.sets.offsets, &e.sets.elems, &e.valid),
            (&vec![0, 0, 0, 2], &vec![4, 2], &vec![false, false, true])
        );
        let e = &encode("test", &[vec![null]]).unwrap()[0];
        assert_eq!((&e.sets.offsets, &e.valid), (&vec![0, 0, 0], &vec![false, false]));
    }
}
