//! The one reader of list columns (issue 29): every list argument or column
//! (the multiset functions, `sorted_intersect`, the similarity join's sets,
//! the families' sets) is read here into its element values and each row's
//! range of them.

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::compute::{cast_with_options, CastOptions};
use datafusion::arrow::datatypes::DataType;
use datafusion::error::{DataFusionError, Result};

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

/// A list column with its element values cast to one type: each row's range
/// of them, and which rows are NULL lists.
pub struct ListColumn {
    /// None: a `DataType::Null` column (every row a NULL list).
    pub values: Option<ArrayRef>,
    /// Row `i`'s elements: `values[ranges[i].0..ranges[i].1]`.
    pub ranges: Vec<(usize, usize)>,
    /// The list column's own NULLs (logical).
    pub nulls: Option<NullBuffer>,
}

impl ListColumn {
    /// `array`'s lists with their elements cast to `element`. The cast is not
    /// `safe`: a value the type cannot hold (an unsigned value beyond i64 in
    /// mixed signed and unsigned lists) fails, never becomes a NULL element.
    pub fn new(array: &ArrayRef, element: &DataType) -> Result<Self> {
        let nulls = array.logical_nulls();
        Ok(match list_parts(array)? {
            None => Self { values: None, ranges: vec![(0, 0); array.len()], nulls },
            Some((values, ranges)) => {
                let opts = CastOptions { safe: false, ..Default::default() };
                Self { values: Some(cast_with_options(&values, element, &opts)?), ranges, nulls }
            }
        })
    }

    /// Is row `i` a list (not NULL)?
    pub fn is_valid(&self, i: usize) -> bool {
        self.values.is_some() && self.nulls.as_ref().is_none_or(|n| n.is_valid(i))
    }
}

/// The longest string [`inline_key`] holds.
pub const INLINE_STRING_BYTES: usize = 7;

/// A string of at most [`INLINE_STRING_BYTES`] bytes as a u64 that orders as
/// the bytes do: byte i in bits 63 - 8i down to 56 - 8i, zeros after the
/// last, and the length in the low byte (so "ab" < "ab\0" < "ab\0\0": a
/// prefix padded with zeros ties with the longer string's NUL bytes, and the
/// length breaks the tie the way byte order does).
pub fn inline_key(bytes: &[u8]) -> u64 {
    let mut k = bytes.len() as u64;
    // Callers check the length (a longer string would lose its tail here).
    for (i, &x) in bytes.iter().take(INLINE_STRING_BYTES).enumerate() {
        k |= (x as u64) << (56 - 8 * i);
    }
    k
}

/// [`inline_key`] of `data[start..end]` (at most [`INLINE_STRING_BYTES`]
/// bytes) with one 8-byte load where the buffer allows: the per-element path
/// of the list functions, which key a string column's values in place.
#[inline]
pub fn inline_key_in(data: &[u8], start: usize, end: usize) -> u64 {
    let len = end - start;
    if len == 0 {
        return 0;
    }
    let word = match data.get(start..start + 8) {
        Some(w) => u64::from_be_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]),
        None => {
            let mut w = [0u8; 8];
            let tail = &data[start..end.min(start + 8)];
            w[..tail.len()].copy_from_slice(tail);
            u64::from_be_bytes(w)
        }
    };
    // Keep the string's own bytes (len <= 7, so the low byte is always cleared), then its length.
    (word & (!0u64 << (8 * (8 - len.min(INLINE_STRING_BYTES))))) | len as u64
}

/// [`inline_key`] of a string held in a Utf8View `view` (at most
/// [`INLINE_STRING_BYTES`] bytes, so its bytes lie in the view itself).
#[inline]
pub fn inline_key_of_view(view: u128) -> u64 {
    let len = (view as u32 as usize).min(INLINE_STRING_BYTES);
    if len == 0 {
        return 0;
    }
    // The view's bytes 4..12 are the string's first 8 bytes, little-endian.
    let word = ((view >> 32) as u64).swap_bytes();
    (word & (!0u64 << (8 * (8 - len)))) | len as u64
}

/// The bytes [`inline_key`] packed into `key`, written into `out`.
pub fn inline_bytes(key: u64, out: &mut [u8; 8]) -> &[u8] {
    let len = ((key & 0xff) as usize).min(INLINE_STRING_BYTES);
    for (i, b) in out.iter_mut().enumerate().take(len) {
        *b = (key >> (56 - 8 * i)) as u8;
    }
    &out[..len]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-load keys equal the byte loop's, at the buffer's end too, and for views.
    #[test]
    fn fast_inline_keys_equal_the_reference() {
        use datafusion::arrow::array::StringViewArray;
        let words = ["", "a", "\0", "ab\0", "zzzzzzz", "é", "1234567", "0"];
        let data: Vec<u8> = words.concat().into_bytes();
        let mut at = 0;
        for w in words {
            assert_eq!(inline_key_in(&data, at, at + w.len()), inline_key(w.as_bytes()), "{w:?}");
            at += w.len();
        }
        let views = StringViewArray::from_iter_values(words);
        for (w, v) in words.iter().zip(views.views().iter()) {
            assert_eq!(inline_key_of_view(*v), inline_key(w.as_bytes()), "{w:?}");
        }
    }
}
