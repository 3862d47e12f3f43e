//! Parquet page headers (thrift compact protocol), the few fields the device
//! scan needs. The parquet crate parses them too, but keeps its `PageHeader`
//! private; this reader skips every field it does not name, so statistics,
//! CRCs and future fields pass through.

use datafusion::error::{DataFusionError, Result};

/// Page types (parquet.thrift `PageType`).
pub const DATA_PAGE: i32 = 0;
pub const INDEX_PAGE: i32 = 1;
pub const DICTIONARY_PAGE: i32 = 2;
pub const DATA_PAGE_V2: i32 = 3;

/// Encodings (parquet.thrift `Encoding`) the device decodes.
pub const PLAIN: i32 = 0;
pub const PLAIN_DICTIONARY: i32 = 2;
pub const RLE: i32 = 3;
pub const DELTA_BINARY_PACKED: i32 = 5;
pub const RLE_DICTIONARY: i32 = 8;

/// The fields of a page header the scan reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PageHeader {
    pub page_type: i32,
    pub uncompressed_size: i32,
    pub compressed_size: i32,
    pub num_values: i32,
    pub encoding: i32,
    /// v1: the definition levels' encoding.
    pub def_encoding: i32,
    /// v2 only.
    pub num_nulls: i32,
    pub num_rows: i32,
    pub def_len: i32,
    pub rep_len: i32,
    /// v2: whether the values section is compressed (default true).
    pub is_compressed: bool,
}

fn bad(what: &str) -> DataFusionError {
    DataFusionError::External(format!("setfusion device scan: corrupt page header ({what})").into())
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8> {
        let v = *self.b.get(self.pos).ok_or_else(|| bad("truncated"))?;
        self.pos += 1;
        Ok(v)
    }
    fn varint(&mut self) -> Result<u64> {
        let mut x = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            x |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(x);
            }
        }
        Err(bad("varint"))
    }
    fn zigzag(&mut self) -> Result<i64> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }
    fn i32(&mut self) -> Result<i32> {
        i32::try_from(self.zigzag()?).map_err(|_| bad("i32 out of range"))
    }
    fn skip_bytes(&mut self, n: usize) -> Result<()> {
        if self.pos + n > self.b.len() {
            return Err(bad("truncated"));
        }
        self.pos += n;
        Ok(())
    }
    /// Skip one value of compact type `t`.
    fn skip(&mut self, t: u8, depth: usize) -> Result<()> {
        if depth > 32 {
            return Err(bad("nesting"));
        }
        match t {
            1 | 2 => Ok(()),
            3 => self.skip_bytes(1),
            4..=6 => self.varint().map(|_| ()),
            7 => self.skip_bytes(8),
            8 => {
                let n = self.varint()? as usize;
                self.skip_bytes(n)
            }
            9 | 10 => {
                let h = self.byte()?;
                let n = if h >> 4 == 15 { self.varint()? as usize } else { (h >> 4) as usize };
                let et = h & 15;
                for _ in 0..n {
                    // Booleans in lists take one byte each.
                    if et == 1 || et == 2 {
                        self.skip_bytes(1)?;
                    } else {
                        self.skip(et, depth + 1)?;
                    }
                }
                Ok(())
            }
            11 => {
                let n = self.varint()? as usize;
                if n > 0 {
                    let kv = self.byte()?;
                    for _ in 0..n {
                        self.skip(kv >> 4, depth + 1)?;
                        self.skip(kv & 15, depth + 1)?;
                    }
                }
                Ok(())
            }
            12 => self.fields(depth + 1, &mut |r, _, t| r.skip(t, depth + 1)),
            _ => Err(bad("field type")),
        }
    }
    /// Walk a struct's fields, calling `f(reader, id, type)` for each (which must consume the value).
    fn fields(&mut self, depth: usize, f: &mut dyn FnMut(&mut Self, i16, u8) -> Result<()>) -> Result<()> {
        let mut last: i16 = 0;
        loop {
            let h = self.byte()?;
            if h == 0 {
                return Ok(());
            }
            let t = h & 15;
            let id = if h >> 4 == 0 {
                i16::try_from(self.zigzag()?).map_err(|_| bad("field id"))?
            } else {
                last.wrapping_add((h >> 4) as i16)
            };
            last = id;
            f(self, id, t)?;
            let _ = depth;
        }
    }
}

/// Parse the page header at the start of `b`; returns it and its length in bytes.
pub fn read_page_header(b: &[u8]) -> Result<(PageHeader, usize)> {
    let mut r = Reader { b, pos: 0 };
    let mut h = PageHeader { is_compressed: true, ..Default::default() };
    r.fields(0, &mut |r, id, t| match (id, t) {
        (1, 5) => r.i32().map(|v| h.page_type = v),
        (2, 5) => r.i32().map(|v| h.uncompressed_size = v),
        (3, 5) => r.i32().map(|v| h.compressed_size = v),
        (5, 12) => r.fields(1, &mut |r, id, t| match (id, t) {
            (1, 5) => r.i32().map(|v| h.num_values = v),
            (2, 5) => r.i32().map(|v| h.encoding = v),
            (3, 5) => r.i32().map(|v| h.def_encoding = v),
            _ => r.skip(t, 1),
        }),
        (7, 12) => r.fields(1, &mut |r, id, t| match (id, t) {
            (1, 5) => r.i32().map(|v| h.num_values = v),
            (2, 5) => r.i32().map(|v| h.encoding = v),
            _ => r.skip(t, 1),
        }),
        (8, 12) => r.fields(1, &mut |r, id, t| match (id, t) {
            (1, 5) => r.i32().map(|v| h.num_values = v),
            (2, 5) => r.i32().map(|v| h.num_nulls = v),
            (3, 5) => r.i32().map(|v| h.num_rows = v),
            (4, 5) => r.i32().map(|v| h.encoding = v),
            (5, 5) => r.i32().map(|v| h.def_len = v),
            (6, 5) => r.i32().map(|v| h.rep_len = v),
            (7, 1) => {
                h.is_compressed = true;
                Ok(())
            }
            (7, 2) => {
                h.is_compressed = false;
                Ok(())
            }
            _ => r.skip(t, 1),
        }),
        _ => r.skip(t, 0),
    })?;
    if h.compressed_size < 0 || h.uncompressed_size < 0 || h.num_values < 0 || h.def_len < 0 || h.rep_len < 0 {
        return Err(bad("negative size"));
    }
    Ok((h, r.pos))
}
