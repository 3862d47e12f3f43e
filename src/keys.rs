//! Arrow key columns -> 64-bit device keys.
//!
//! One fixed-width column of at most 64 bits becomes its own value (exact: two
//! keys are equal iff the SQL values are equal). Everything else becomes a
//! 64-bit hash of exact key bytes ([`KeyBytes`]): one string or binary column
//! is hashed over its values' bytes as Arrow holds them (no copy, no row
//! encoding; on the GPU backend the device reads the offsets or views and the
//! value buffers itself), other keys (composite keys with strings, decimals
//! wider than 18 digits) over Arrow's row encoding. Hashed keys are
//! *candidates*: every match is verified on the exact bytes (see
//! [`verify_or_exact`], and its device counterpart in
//! [`crate::algo::row_hash`]), so a hash collision can never change a result.
//!
//! SQL equality on floats: -0.0 = 0.0, and every NaN equals every NaN
//! (DataFusion's grouping semantics); values are normalised before encoding.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, PrimitiveArray};
use datafusion::arrow::buffer::{Buffer, NullBuffer, ScalarBuffer};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float32Type, Float64Type, Int64Type};
use datafusion::arrow::row::{RowConverter, Rows, SortField};
use datafusion::error::{DataFusionError, Result};

/// Why a key type cannot be encoded (shown in EXPLAIN as the CPU reason).
pub fn unsupported_reason(types: &[DataType]) -> Option<String> {
    for t in types {
        if !supported(t) {
            return Some(format!("key type {t} is not supported on the device"));
        }
    }
    None
}

fn supported(t: &DataType) -> bool {
    use DataType::*;
    if let Dictionary(_, v) = t {
        return supported(v);
    }
    matches!(
        t,
        Boolean | Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Float16 | Float32 | Float64
            | Date32 | Date64 | Time32(_) | Time64(_) | Timestamp(_, _) | Duration(_) | Interval(_)
            | Decimal32(_, _) | Decimal64(_, _) | Decimal128(_, _) | Decimal256(_, _)
            | Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView | FixedSizeBinary(_) | Null
    )
}

/// The type a key column is encoded as: dictionaries become their values,
/// string and binary dictionaries the view type, whose views then point into
/// the dictionary's values (arrow's cast shares that buffer: 16 bytes a row,
/// no string copied). Other types are their own.
pub fn key_type(t: &DataType) -> DataType {
    use DataType::*;
    match t {
        Dictionary(_, v) => match v.as_ref() {
            Utf8 | LargeUtf8 | Utf8View => Utf8View,
            Binary | LargeBinary | BinaryView => BinaryView,
            other => key_type(other),
        },
        other => other.clone(),
    }
}

/// Is a single column of this type encoded exactly (its value is the key)?
pub fn is_exact(types: &[DataType]) -> bool {
    use DataType::*;
    match types {
        [t] => match t {
            Boolean | Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Float32 | Float64 | Date32
            | Date64 | Time32(_) | Time64(_) | Timestamp(_, _) | Duration(_) => true,
            Decimal128(p, _) | Decimal64(p, _) | Decimal32(p, _) => *p <= 18,
            _ => false,
        },
        _ => false,
    }
}

/// Key columns of one side, over all its batches.
pub struct KeyColumns {
    /// One key per row (value or hash), in chunks read back to back. Exact
    /// 64-bit integer columns are borrowed from the Arrow buffers (no copy).
    /// Empty for hash-encoded keys whose hashing was deferred (see
    /// [`KeyColumns::hashes_deferred`]): the device hashes them itself.
    pub chunks: Vec<ScalarBuffer<u64>>,
    /// Rows where some key column is NULL (None: no NULLs).
    pub nulls: Option<NullBuffer>,
    /// Exact key bytes for verification (hash-encoded keys only).
    pub bytes: Option<KeyBytes>,
}

impl KeyColumns {
    pub fn len(&self) -> usize {
        match &self.bytes {
            Some(b) => b.len(),
            None => self.chunks.iter().map(|c| c.len()).sum(),
        }
    }
    /// Hash-encoded keys that were not hashed on the host: `chunks` is empty
    /// and the hashes must be computed from `bytes` ([`hash_rows`] or the device).
    pub fn hashes_deferred(&self) -> bool {
        self.bytes.is_some() && self.chunks.is_empty()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The key chunks as slices.
    pub fn slices(&self) -> Vec<&[u64]> {
        self.chunks.iter().map(|c| c.as_ref()).collect()
    }
    /// Every key, in row order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.chunks.iter().flat_map(|c| c.iter().copied())
    }
    pub fn is_null(&self, i: usize) -> bool {
        self.nulls.as_ref().is_some_and(|n| n.is_null(i))
    }
    pub fn null_count(&self) -> usize {
        self.nulls.as_ref().map_or(0, |n| n.null_count())
    }
}

/// NULL rows over all batches (a row is NULL if any key column is).
fn key_nulls(batches: &[Vec<ArrayRef>]) -> Option<NullBuffer> {
    if !batches.iter().flatten().any(|c| c.logical_null_count() > 0) {
        return None;
    }
    let mut b = datafusion::arrow::array::BooleanBufferBuilder::new(0);
    for cols in batches {
        let n = cols.iter().fold(None::<NullBuffer>, |acc, c| NullBuffer::union(acc.as_ref(), c.logical_nulls().as_ref()));
        match n {
            Some(n) => b.append_buffer(n.inner()),
            None => b.append_n(cols.first().map_or(0, |c| c.len()), true),
        }
    }
    Some(NullBuffer::new(b.finish())).filter(|n| n.null_count() > 0)
}

/// Encode key columns given per batch (`batches[b][c]`: key column c of batch b;
/// all batches have the same types). `converter` must be shared by both sides of
/// an operator so their row bytes are comparable. With `host_hashes == false`,
/// hash-encoded keys keep only their row bytes (the GPU backend hashes them on
/// the device; see [`KeyColumns::hashes_deferred`]).
pub fn encode(
    batches: &[Vec<ArrayRef>],
    types: &[DataType],
    converter: Option<&RowConverter>,
    host_hashes: bool,
) -> Result<KeyColumns> {
    let nulls = key_nulls(batches);
    if is_exact(types) {
        let chunks = crate::gpu::par_map(batches, 128, |cols| exact_values(&cols[0]))?;
        return Ok(KeyColumns { chunks, nulls, bytes: None });
    }
    if is_byte_column(types) {
        let mut column = ByteColumn::new(batches.iter().map(|cols| cols[0].clone()).collect())?;
        if !host_hashes {
            column.compact_bloated_views()?;
        }
        let chunks = if host_hashes {
            column.hash_arrays().into_iter().map(ScalarBuffer::from).collect()
        } else {
            Vec::new()
        };
        return Ok(KeyColumns { chunks, nulls, bytes: Some(KeyBytes::Values(column)) });
    }
    let converter = converter.ok_or_else(|| DataFusionError::Internal("hash keys need a row converter".into()))?;
    let columns: Vec<ArrayRef> = (0..types.len())
        .map(|c| {
            let parts: Vec<&dyn Array> = batches.iter().map(|b| b[c].as_ref()).collect();
            if parts.is_empty() {
                Ok(datafusion::arrow::array::new_empty_array(&types[c]))
            } else {
                datafusion::arrow::compute::concat(&parts).map_err(DataFusionError::from)
            }
        })
        .collect::<Result<_>>()?;
    let normalized: Vec<ArrayRef> = columns.iter().map(normalize_floats).collect::<Result<_>>()?;
    let rows = converter.convert_columns(&normalized)?;
    let bytes = KeyBytes::Rows(rows);
    let chunks = if host_hashes { vec![ScalarBuffer::from(hash_rows(RowSubset::all(&bytes)))] } else { Vec::new() };
    Ok(KeyColumns { chunks, nulls, bytes: Some(bytes) })
}

/// Composite keys whose columns are each exact (integers, dates, decimals of
/// at most 18 digits, ...) and whose value ranges over both sides multiply to
/// less than 2^64 become one exact 64-bit key per row: column by column,
/// `key = key * range + (value - min)`, with one more slot per column for
/// NULL. Such keys need no row encoding, hashing or verification (TPC-H's
/// (partkey, suppkey) went from ~80 ns a row through row hashing to a few).
/// Returns None when the keys do not qualify. In the NULL-equal mode the
/// NULL slots make (NULL, 1) equal to (NULL, 1) only, as row encoding did.
pub fn encode_packed(a: &[Vec<ArrayRef>], b: &[Vec<ArrayRef>], types: &[DataType]) -> Result<Option<(KeyColumns, KeyColumns)>> {
    if types.len() < 2 || !types.iter().all(|t| is_exact(std::slice::from_ref(t))) {
        return Ok(None);
    }
    // Each batch's columns as 64-bit images (reinterpreted as i64: injective per type).
    let images = |side: &[Vec<ArrayRef>]| {
        crate::gpu::par_map(side, 16, |cols| cols.iter().map(exact_values).collect::<Result<Vec<_>>>())
    };
    let (ai, bi) = (images(a)?, images(b)?);
    // (min, max) of each column's valid values, over both sides.
    let mut bounds: Vec<Option<(i64, i64)>> = vec![None; types.len()];
    let per_batch = |(imgs, cols): (&Vec<ScalarBuffer<u64>>, &Vec<ArrayRef>)| -> Vec<Option<(i64, i64)>> {
        imgs.iter()
            .zip(cols)
            .map(|(v, c)| {
                let nulls = c.logical_nulls();
                v.iter()
                    .enumerate()
                    .filter(|(i, _)| nulls.as_ref().is_none_or(|n| n.is_valid(*i)))
                    .fold(None, |acc: Option<(i64, i64)>, (_, &x)| {
                        let x = x as i64;
                        Some(acc.map_or((x, x), |(lo, hi)| (lo.min(x), hi.max(x))))
                    })
            })
            .collect()
    };
    let pairs: Vec<(&Vec<ScalarBuffer<u64>>, &Vec<ArrayRef>)> = ai.iter().zip(a).chain(bi.iter().zip(b)).collect();
    let found = crate::gpu::par_map(&pairs, 16, |p| Ok::<_, DataFusionError>(per_batch(*p)))?;
    for batch in found {
        for (c, f) in batch.into_iter().enumerate() {
            if let Some((lo, hi)) = f {
                bounds[c] = Some(bounds[c].map_or((lo, hi), |(l, h)| (l.min(lo), h.max(hi))));
            }
        }
    }
    // Slots per column: its values, then NULL.
    let ranges: Vec<u128> = bounds.iter().map(|b| b.map_or(0, |(lo, hi)| (hi as i128 - lo as i128) as u128 + 1) + 1).collect();
    if ranges.iter().try_fold(1u128, |acc, r| acc.checked_mul(*r).filter(|p| *p < 1u128 << 64)).is_none() {
        return Ok(None);
    }
    let mins: Vec<i64> = bounds.iter().map(|b| b.map_or(0, |(lo, _)| lo)).collect();
    let pack = |side: &[Vec<ArrayRef>], imgs: &[Vec<ScalarBuffer<u64>>]| -> Result<KeyColumns> {
        let pairs: Vec<(&Vec<ScalarBuffer<u64>>, &Vec<ArrayRef>)> = imgs.iter().zip(side).collect();
        let chunks = crate::gpu::par_map(&pairs, 16, |(imgs, cols)| {
            let n = cols.first().map_or(0, |c| c.len());
            let mut keys = vec![0u64; n];
            for (c, (v, col)) in imgs.iter().zip(cols.iter()).enumerate() {
                let (range, min) = (ranges[c] as u64, mins[c]);
                let nulls = col.logical_nulls();
                for (i, k) in keys.iter_mut().enumerate() {
                    let slot = match &nulls {
                        Some(nb) if nb.is_null(i) => range - 1,
                        _ => (v[i] as i64).wrapping_sub(min) as u64,
                    };
                    *k = k.wrapping_mul(range).wrapping_add(slot);
                }
            }
            Ok::<_, DataFusionError>(ScalarBuffer::from(keys))
        })?;
        Ok(KeyColumns { chunks, nulls: key_nulls(side), bytes: None })
    };
    Ok(Some((pack(a, &ai)?, pack(b, &bi)?)))
}

/// A row converter for these key types (None when the keys are exact or one
/// string / binary column, whose values are their own key bytes).
pub fn converter_for(types: &[DataType]) -> Result<Option<RowConverter>> {
    if is_exact(types) || is_byte_column(types) {
        return Ok(None);
    }
    let fields = types.iter().map(|t| SortField::new(normalized_type(t))).collect();
    Ok(Some(RowConverter::new(fields)?))
}

fn normalized_type(t: &DataType) -> DataType {
    t.clone()
}

fn canon_f64(v: f64) -> u64 {
    if v.is_nan() {
        f64::NAN.to_bits()
    } else if v == 0.0 {
        0
    } else {
        v.to_bits()
    }
}

fn canon_f32(v: f32) -> u64 {
    if v.is_nan() {
        f32::NAN.to_bits() as u64
    } else if v == 0.0 {
        0
    } else {
        v.to_bits() as u64
    }
}

/// Replace -0.0 by 0.0 and every NaN by the canonical NaN, so byte equality is SQL equality.
fn normalize_floats(a: &ArrayRef) -> Result<ArrayRef> {
    Ok(match a.data_type() {
        DataType::Float64 => Arc::new(a.as_primitive::<Float64Type>().unary::<_, Float64Type>(|v| f64::from_bits(canon_f64(v)))),
        DataType::Float32 => {
            Arc::new(a.as_primitive::<Float32Type>().unary::<_, Float32Type>(|v| f32::from_bits(canon_f32(v) as u32)))
        }
        _ => a.clone(),
    })
}

/// Is the key of a value of this type its own 64 bits? Then the key column
/// is the Arrow values buffer itself, and a key is also the column's value.
pub fn key_is_own_bits(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int64 | DataType::UInt64 | DataType::Date64 | DataType::Timestamp(_, _) | DataType::Duration(_) | DataType::Time64(_)
    )
}

/// Exact 64-bit image of a single fixed-width column (NULL slots hold arbitrary values).
/// 64-bit integer columns share the Arrow buffer: no copy.
fn exact_values(a: &ArrayRef) -> Result<ScalarBuffer<u64>> {
    if key_is_own_bits(a.data_type()) {
        let data = a.to_data();
        return Ok(ScalarBuffer::new(data.buffers()[0].clone(), data.offset(), data.len()));
    }
    Ok(ScalarBuffer::from(exact_values_owned(a)?))
}

fn exact_values_owned(a: &ArrayRef) -> Result<Vec<u64>> {
    Ok(match a.data_type() {
        DataType::Float64 => a.as_primitive::<Float64Type>().values().iter().map(|v| canon_f64(*v)).collect(),
        DataType::Float32 => a.as_primitive::<Float32Type>().values().iter().map(|v| canon_f32(*v)).collect(),
        DataType::Int64 => a.as_primitive::<Int64Type>().values().iter().map(|v| *v as u64).collect(),
        DataType::UInt64 => a.as_primitive::<datafusion::arrow::datatypes::UInt64Type>().values().to_vec(),
        DataType::Boolean => {
            let b = a.as_boolean();
            (0..b.len()).map(|i| b.value(i) as u64).collect()
        }
        DataType::Decimal128(_, _) => a
            .as_primitive::<datafusion::arrow::datatypes::Decimal128Type>()
            .values()
            .iter()
            .map(|v| *v as i64 as u64)
            .collect(),
        _ => {
            // Every other exact type is an integer of at most 64 bits underneath.
            let data = a.to_data();
            let width = a.data_type().primitive_width().unwrap_or(8);
            let raw = datafusion::arrow::array::make_array(data.into_builder().data_type(int_of_width(width)).build()?);
            let as64 = cast(&raw, &DataType::Int64)?;
            let p: &PrimitiveArray<Int64Type> = as64.as_primitive();
            p.values().iter().map(|v| *v as u64).collect()
        }
    })
}

fn int_of_width(w: usize) -> DataType {
    match w {
        1 => DataType::Int8,
        2 => DataType::Int16,
        4 => DataType::Int32,
        _ => DataType::Int64,
    }
}

/// 64-bit hash of a byte string (the same function on every platform).
pub fn hash_bytes(b: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h: u64 = (b.len() as u64).wrapping_mul(K) ^ 0x243F_6A88_85A3_08D3;
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let v = u64::from_le_bytes(c.try_into().unwrap());
        h = (h ^ v).wrapping_mul(K).rotate_left(29);
    }
    let mut tail = [0u8; 8];
    let r = chunks.remainder();
    tail[..r.len()].copy_from_slice(r);
    h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(K);
    h ^= h >> 32;
    h = h.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    h ^ (h >> 32)
}

/// Is this one string or binary column, whose values' bytes are its keys?
/// (Byte equality is SQL equality for these types.)
pub fn is_byte_column(types: &[DataType]) -> bool {
    use DataType::*;
    matches!(types, [Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView])
}

/// The exact bytes behind hash-encoded keys, one byte string per row.
pub enum KeyBytes {
    /// Arrow's row format: composite keys, wide decimals, fixed-size binary.
    Rows(Rows),
    /// One string / binary column as Arrow holds it (see [`is_byte_column`]).
    Values(ByteColumn),
}

impl KeyBytes {
    pub fn len(&self) -> usize {
        match self {
            KeyBytes::Rows(r) => r.num_rows(),
            KeyBytes::Values(c) => c.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One string / binary column over several batches, not copied.
pub struct ByteColumn {
    arrays: Vec<ArrayRef>,
    /// The first row of each array, then the total (`arrays.len() + 1` entries).
    starts: Vec<usize>,
}

impl ByteColumn {
    /// Every array must be a string or binary array ([`is_byte_column`]), all of one type.
    pub fn new(arrays: Vec<ArrayRef>) -> Result<Self> {
        let mut starts = Vec::with_capacity(arrays.len() + 1);
        starts.push(0);
        for a in &arrays {
            ByteParts::of(a.as_ref())?;
            if a.data_type() != arrays[0].data_type() {
                return Err(DataFusionError::Internal(format!("key column of {} and {}", a.data_type(), arrays[0].data_type())));
            }
            starts.push(starts[starts.len() - 1] + a.len());
        }
        Ok(Self { arrays, starts })
    }
    pub fn len(&self) -> usize {
        self.starts[self.starts.len() - 1]
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn arrays(&self) -> &[ArrayRef] {
        &self.arrays
    }
    /// The first row of each array, then the total.
    pub fn starts(&self) -> &[usize] {
        &self.starts
    }
    /// View arrays keep every buffer their rows came from: after a filter they
    /// may hold several times the bytes their rows use (TPC-H SF10 o_comment
    /// of half the orders: 800 MB of pages for 370 MB of values). Those are
    /// compacted (arrow's `gc`, array by array on the copy threads) so the
    /// device path uploads the used bytes only. Buffers shared by many arrays
    /// (views into a Parquet dictionary page) count once and stay as they are.
    pub fn compact_bloated_views(&mut self) -> Result<()> {
        fn views(a: &ArrayRef) -> Option<(usize, &[Buffer])> {
            match a.data_type() {
            DataType::Utf8View => Some((a.as_string_view().total_buffer_bytes_used(), a.as_string_view().data_buffers())),
            DataType::BinaryView => Some((a.as_binary_view().total_buffer_bytes_used(), a.as_binary_view().data_buffers())),
            _ => None,
            }
        }
        if self.arrays.first().and_then(views).is_none() {
            return Ok(());
        }
        let used: usize = crate::gpu::par_map(&self.arrays, 16, |a| Ok::<_, DataFusionError>(views(a).map_or(0, |v| v.0)))?.iter().sum();
        let mut seen = std::collections::HashSet::new();
        let held: usize = self
            .arrays
            .iter()
            .filter_map(views)
            .flat_map(|(_, bufs)| bufs.iter())
            .filter(|b| seen.insert((b.as_ptr() as usize, b.len())))
            .map(|b| b.len())
            .sum();
        if held <= 2 * used + (64 << 20) {
            return Ok(());
        }
        self.arrays = crate::gpu::par_map(&self.arrays, 16, |a| {
            Ok::<ArrayRef, DataFusionError>(match a.data_type() {
                DataType::Utf8View => Arc::new(a.as_string_view().gc()),
                DataType::BinaryView => Arc::new(a.as_binary_view().gc()),
                _ => a.clone(),
            })
        })?;
        Ok(())
    }

    /// [`hash_bytes`] of every value, array by array on the copy threads.
    fn hash_arrays(&self) -> Vec<Vec<u64>> {
        let hashed = crate::gpu::par_map(&self.arrays, 16, |a| {
            let p = parts_of(a);
            Ok::<_, std::convert::Infallible>((0..p.len()).map(|i| hash_bytes(p.value(i))).collect())
        });
        match hashed {
            Ok(h) => h,
            Err(never) => match never {},
        }
    }

    /// Bytes of row `i` (`i < len()`).
    fn value(&self, i: usize) -> &[u8] {
        let b = self.starts.partition_point(|&s| s <= i) - 1;
        parts_of(&self.arrays[b]).value(i - self.starts[b])
    }
}

/// A string / binary array's buffers, read without a type dispatch per row.
#[derive(Clone, Copy)]
pub enum ByteParts<'a> {
    /// Utf8 / Binary: value `i` is `data[offsets[i]..offsets[i + 1]]`.
    Offsets32(&'a [i32], &'a [u8]),
    /// LargeUtf8 / LargeBinary.
    Offsets64(&'a [i64], &'a [u8]),
    /// Utf8View / BinaryView: 16-byte views (little-endian length, then 12
    /// inline bytes, or a 4-byte prefix, buffer index and offset) and the buffers.
    Views(&'a [u8], &'a [Buffer]),
}

impl<'a> ByteParts<'a> {
    pub fn of(a: &'a dyn Array) -> Result<Self> {
        use DataType::*;
        Ok(match a.data_type() {
            Utf8 => ByteParts::Offsets32(a.as_string::<i32>().value_offsets(), a.as_string::<i32>().value_data()),
            Binary => ByteParts::Offsets32(a.as_binary::<i32>().value_offsets(), a.as_binary::<i32>().value_data()),
            LargeUtf8 => ByteParts::Offsets64(a.as_string::<i64>().value_offsets(), a.as_string::<i64>().value_data()),
            LargeBinary => ByteParts::Offsets64(a.as_binary::<i64>().value_offsets(), a.as_binary::<i64>().value_data()),
            Utf8View => ByteParts::Views(a.as_string_view().views().inner().as_slice(), a.as_string_view().data_buffers()),
            BinaryView => ByteParts::Views(a.as_binary_view().views().inner().as_slice(), a.as_binary_view().data_buffers()),
            t => return Err(DataFusionError::Internal(format!("{t} is not a string or binary column"))),
        })
    }
    pub fn len(&self) -> usize {
        match self {
            ByteParts::Offsets32(o, _) => o.len() - 1,
            ByteParts::Offsets64(o, _) => o.len() - 1,
            ByteParts::Views(v, _) => v.len() / 16,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes of value `i` (`i < len()`; NULL slots give whatever they hold).
    #[inline]
    pub fn value(&self, i: usize) -> &'a [u8] {
        match *self {
            ByteParts::Offsets32(o, d) => &d[o[i] as usize..o[i + 1] as usize],
            ByteParts::Offsets64(o, d) => &d[o[i] as usize..o[i + 1] as usize],
            ByteParts::Views(v, bufs) => {
                let view = &v[16 * i..16 * i + 16];
                let word = |k: usize| u32::from_le_bytes(view[k..k + 4].try_into().unwrap()) as usize;
                let len = word(0);
                if len <= 12 {
                    &view[4..4 + len]
                } else {
                    &bufs[word(8)].as_slice()[word(12)..word(12) + len]
                }
            }
        }
    }
}

/// [`ByteParts::of`] for arrays [`ByteColumn::new`] already checked.
fn parts_of(a: &ArrayRef) -> ByteParts<'_> {
    ByteParts::of(a.as_ref()).expect("checked by ByteColumn::new")
}

/// Some rows of [`KeyBytes`]: all of them, or those at `idx` (e.g. the non-NULL
/// keys), in that order. Lets verification and the device read a subset
/// without copying it.
#[derive(Clone, Copy)]
pub struct RowSubset<'a> {
    bytes: &'a KeyBytes,
    idx: Option<&'a [u32]>,
}

impl<'a> RowSubset<'a> {
    pub fn all(bytes: &'a KeyBytes) -> Self {
        Self { bytes, idx: None }
    }
    /// `idx` must index the rows (checked once here, so reads never panic later).
    pub fn new(bytes: &'a KeyBytes, idx: Option<&'a [u32]>) -> Result<Self> {
        if let Some(ix) = idx {
            if ix.iter().any(|&i| i as usize >= bytes.len()) {
                return Err(DataFusionError::Internal("row subset index out of range".into()));
            }
        }
        Ok(Self { bytes, idx })
    }
    pub fn len(&self) -> usize {
        self.idx.map_or(self.bytes.len(), |ix| ix.len())
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn bytes(&self) -> &'a KeyBytes {
        self.bytes
    }
    pub fn idx(&self) -> Option<&'a [u32]> {
        self.idx
    }
    /// Every row's bytes, in order (arrays are walked in turn, not searched, when all rows are read).
    pub fn iter(self) -> Box<dyn Iterator<Item = &'a [u8]> + 'a> {
        match (self.bytes, self.idx) {
            (KeyBytes::Rows(r), None) => Box::new(r.iter().map(|r| r.data())),
            (KeyBytes::Rows(r), Some(ix)) => Box::new(ix.iter().map(move |&i| r.row(i as usize).data())),
            (KeyBytes::Values(c), None) => Box::new(c.arrays.iter().flat_map(|a| {
                let p = parts_of(a);
                (0..p.len()).map(move |i| p.value(i))
            })),
            (KeyBytes::Values(c), Some(ix)) => Box::new(ix.iter().map(move |&i| c.value(i as usize))),
        }
    }
    /// Total bytes of the subset's rows.
    pub fn data_len(&self) -> usize {
        match (self.bytes, self.idx) {
            (KeyBytes::Rows(r), None) => r.lengths().sum(),
            (KeyBytes::Rows(r), Some(ix)) => ix.iter().map(|&i| r.row_len(i as usize)).sum(),
            _ => self.iter().map(|r| r.len()).sum(),
        }
    }
}

/// Host hashes of rows ([`hash_bytes`] of each row's bytes); a whole string
/// column is hashed array by array on several threads.
pub fn hash_rows(rows: RowSubset<'_>) -> Vec<u64> {
    if let (KeyBytes::Values(c), None) = (rows.bytes, rows.idx) {
        return c.hash_arrays().concat();
    }
    rows.iter().map(hash_bytes).collect()
}

/// For hash-encoded keys: check that equal hashes always mean equal rows
/// across both sides. Returns `None` if the hashes are collision-free (the
/// device result stands), or exact dense ids for both sides if a collision
/// was found (the caller recomputes with them). Deferred hashes are computed here.
pub fn verify_or_exact(build: &KeyColumns, probe: &KeyColumns) -> Option<(Vec<u64>, Vec<u64>)> {
    let (Some(br), Some(pr)) = (&build.bytes, &probe.bytes) else { return None };
    let hashes = |k: &KeyColumns, r| if k.hashes_deferred() { hash_rows(RowSubset::all(r)) } else { k.iter().collect() };
    let (bh, ph) = (hashes(build, br), hashes(probe, pr));
    verify_rows_or_exact(RowSubset::all(br), &bh, RowSubset::all(pr), &ph)
}

/// [`verify_or_exact`] over row subsets and their hashes (`hashes[j]` is the hash of row `j`).
pub fn verify_rows_or_exact<'a>(
    build: RowSubset<'a>,
    build_hashes: &[u64],
    probe: RowSubset<'a>,
    probe_hashes: &[u64],
) -> Option<(Vec<u64>, Vec<u64>)> {
    let mut rep: HashMap<u64, &'a [u8]> = HashMap::with_capacity(build.len() + probe.len());
    let mut collision = build_hashes.len() != build.len() || probe_hashes.len() != probe.len();
    'outer: for (rows, hashes) in [(build, build_hashes), (probe, probe_hashes)] {
        if collision {
            break;
        }
        for (&k, r) in hashes.iter().zip(rows.iter()) {
            if *rep.entry(k).or_insert(r) != r {
                collision = true;
                break 'outer;
            }
        }
    }
    collision.then(|| exact_ids(build, probe))
}

/// Exact dense ids of both sides' rows: equal ids iff equal row bytes.
pub fn exact_ids<'a>(build: RowSubset<'a>, probe: RowSubset<'a>) -> (Vec<u64>, Vec<u64>) {
    let mut ids: HashMap<&'a [u8], u64> = HashMap::with_capacity(build.len() + probe.len());
    let mut id_of = |r: &'a [u8]| {
        let n = ids.len() as u64;
        *ids.entry(r).or_insert(n)
    };
    let b = build.iter().map(&mut id_of).collect();
    let p = probe.iter().map(&mut id_of).collect();
    (b, p)
}

/// A list column's element values and each row's [start, end) range into
/// them; None for a `DataType::Null` column (every row a NULL list).
pub fn list_parts(array: &ArrayRef) -> Result<Option<(ArrayRef, Vec<(usize, usize)>)>> {
    let n = array.len();
    Ok(Some(match array.data_type() {
        DataType::Null => return Ok(None),
        DataType::List(_) => {
            let l = array.as_list::<i32>();
            let o = l.value_offsets();
            (l.values().clone(), (0..n).map(|i| (o[i] as usize, o[i + 1] as usize)).collect())
        }
        DataType::LargeList(_) => {
            let l = array.as_list::<i64>();
            let o = l.value_offsets();
            (l.values().clone(), (0..n).map(|i| (o[i] as usize, o[i + 1] as usize)).collect())
        }
        DataType::FixedSizeList(_, _) => {
            let l = array.as_fixed_size_list();
            let w = l.value_length() as usize;
            (l.values().clone(), (0..n).map(|i| (l.value_offset(i) as usize, l.value_offset(i) as usize + w)).collect())
        }
        other => return Err(DataFusionError::Plan(format!("expected a list column, got {other}"))),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Date32Array, Int32Array, Int64Array, StringArray};
    use rand::{Rng, SeedableRng};

    /// Filtered views that keep a large buffer for few rows are compacted
    /// (same values, small buffers); views sharing one buffer are left alone.
    #[test]
    fn bloated_views_are_compacted() {
        use datafusion::arrow::array::{BooleanArray, StringViewArray};
        let long: Vec<String> = (0..1_000_000).map(|i| format!("{i:0>100}")).collect();
        let all: ArrayRef = Arc::new(StringViewArray::from_iter_values(long.iter()));
        let keep = BooleanArray::from((0..all.len()).map(|i| i % 100 == 0).collect::<Vec<_>>());
        let few = datafusion::arrow::compute::filter(&all, &keep).unwrap();
        let buffers = |c: &ByteColumn| -> usize { c.arrays().iter().flat_map(|a| a.as_string_view().data_buffers()).map(|b| b.len()).sum() };
        let mut col = ByteColumn::new(vec![few.clone(), few.slice(0, 10)]).unwrap();
        let before: Vec<Vec<u8>> = RowSubset::all(&KeyBytes::Values(ByteColumn::new(col.arrays().to_vec()).unwrap())).iter().map(|r| r.to_vec()).collect();
        assert!(buffers(&col) > 100_000_000);
        col.compact_bloated_views().unwrap();
        assert!(buffers(&col) < 2_000_000, "{}", buffers(&col));
        let after: Vec<Vec<u8>> = RowSubset::all(&KeyBytes::Values(col)).iter().map(|r| r.to_vec()).collect();
        assert_eq!(before, after);
        // Every row of the buffer in use, across slices sharing it: kept as it is.
        let mut shared = ByteColumn::new(vec![all.slice(0, 500_000), all.slice(500_000, 500_000)]).unwrap();
        shared.compact_bloated_views().unwrap();
        assert!(std::ptr::eq(shared.arrays()[0].as_string_view().data_buffers()[0].as_ptr(), all.as_string_view().data_buffers()[0].as_ptr()));
    }

    /// Packed keys are equal exactly when the rows are (NULL equal to NULL,
    /// column by column), across batches and both sides.
    #[test]
    fn packed_composite_keys_are_exact() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let batch = |rng: &mut rand::rngs::StdRng, n: usize| -> Vec<ArrayRef> {
            let a: Int64Array = (0..n).map(|_| rng.random_bool(0.9).then(|| rng.random_range(-5..5i64) * 1_000_000_007)).collect();
            let b: Int32Array = (0..n).map(|_| rng.random_bool(0.9).then(|| rng.random_range(i32::MIN..=i32::MIN + 3))).collect();
            let c: Date32Array = (0..n).map(|_| rng.random_bool(0.95).then(|| rng.random_range(0..4))).collect();
            vec![Arc::new(a), Arc::new(b), Arc::new(c)]
        };
        let left: Vec<Vec<ArrayRef>> = (0..3).map(|i| batch(&mut rng, 50 + i * 40)).collect();
        let right: Vec<Vec<ArrayRef>> = (0..2).map(|i| batch(&mut rng, 70 + i)).collect();
        let types = [DataType::Int64, DataType::Int32, DataType::Date32];
        let (lk, rk) = encode_packed(&left, &right, &types).unwrap().expect("ranges fit in 64 bits");
        // The rows as strings ("NULL" for NULL), in the same order as the keys.
        let show = |side: &[Vec<ArrayRef>]| -> Vec<String> {
            side.iter()
                .flat_map(|cols| {
                    (0..cols[0].len()).map(|i| {
                        cols.iter()
                            .map(|c| datafusion::arrow::util::display::array_value_to_string(c, i).unwrap_or_default())
                            .map(|v| if v.is_empty() { "NULL".into() } else { v })
                            .collect::<Vec<String>>()
                            .join("|")
                    }).collect::<Vec<_>>()
                })
                .collect()
        };
        let rows: Vec<String> = show(&left).into_iter().chain(show(&right)).collect();
        let keys: Vec<u64> = lk.iter().chain(rk.iter()).collect();
        assert_eq!(rows.len(), keys.len());
        let mut pairs = 0;
        for i in 0..rows.len() {
            for j in 0..rows.len() {
                assert_eq!(rows[i] == rows[j], keys[i] == keys[j], "{} vs {}", rows[i], rows[j]);
                pairs += (rows[i] == rows[j]) as usize;
            }
        }
        assert!(pairs > rows.len(), "the data must repeat rows");
        // Any NULL column marks the row NULL (for the joins' NULL rules).
        assert!(lk.null_count() > 0);
        // Strings, or ranges past 64 bits, do not qualify.
        let s: Vec<Vec<ArrayRef>> = vec![vec![Arc::new(StringArray::from(vec!["a"])), Arc::new(Int64Array::from(vec![1]))]];
        assert!(encode_packed(&s, &s, &[DataType::Utf8, DataType::Int64]).unwrap().is_none());
        let wide: Vec<Vec<ArrayRef>> =
            vec![vec![Arc::new(Int64Array::from(vec![i64::MIN, i64::MAX])), Arc::new(Int64Array::from(vec![0, 1]))]];
        assert!(encode_packed(&wide, &wide, &[DataType::Int64, DataType::Int64]).unwrap().is_none());
    }
}
