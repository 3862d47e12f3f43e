// Ported from Apache DataFusion 55.2.0, datafusion-sqllogictest:
//   src/engines/conversion.rs, src/engines/output.rs,
//   src/engines/datafusion_engine/normalize.rs, src/util.rs
//
// Licensed to the Apache Software Foundation (ASF) under one
// or more contributor license agreements.  See the NOTICE file
// distributed with this work for additional information
// regarding copyright ownership.  The ASF licenses this file
// to you under the Apache License, Version 2.0 (the
// "License"); you may not use this file except in compliance
// with the License.  You may obtain a copy of the License at
//
//   http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing,
// software distributed under the License is distributed on an
// "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY
// KIND, either express or implied.  See the License for the
// specific language governing permissions and limitations
// under the License.
//
// Changes from the original: the `bigdecimal`, `half` and `itertools`
// dependencies are replaced by small local helpers with identical output
// (half-even rounding to 12 fractional digits, trailing zeros removed, plain
// notation); the Spark float path is dropped; the workspace-root path
// normalisation takes the root from the caller.

//! Value normalisation identical to DataFusion's own sqllogictest engine, so
//! that `.slt` files written for DataFusion validate unchanged.

use datafusion::arrow::array::{self, Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{
    DataType, Decimal128Type, Decimal256Type, Decimal32Type, Decimal64Type, DecimalType, Fields, Schema,
};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::util::display::ArrayFormatter;
use datafusion::config::ConfigField;
use datafusion::error::DataFusionError;
use sqllogictest::{ColumnType, DBOutput};

/// Column type letters of DataFusion's slt files (`query IT?...`).
#[derive(Debug, PartialEq, Eq, Clone)]
pub enum DFColumnType {
    Boolean,
    DateTime,
    Integer,
    Float,
    Text,
    Timestamp,
    Another,
}

impl ColumnType for DFColumnType {
    fn from_char(value: char) -> Option<Self> {
        match value {
            'B' => Some(Self::Boolean),
            'D' => Some(Self::DateTime),
            'I' => Some(Self::Integer),
            'P' => Some(Self::Timestamp),
            'R' => Some(Self::Float),
            'T' => Some(Self::Text),
            _ => Some(Self::Another),
        }
    }

    fn to_char(&self) -> char {
        match self {
            Self::Boolean => 'B',
            Self::DateTime => 'D',
            Self::Integer => 'I',
            Self::Timestamp => 'P',
            Self::Float => 'R',
            Self::Text => 'T',
            Self::Another => '?',
        }
    }
}

pub type DFOutput = DBOutput<DFColumnType>;

/// Represents a constant for NULL string in your database.
pub const NULL_STR: &str = "NULL";

fn bool_to_str(value: bool) -> String {
    if value { "true" } else { "false" }.to_string()
}

fn varchar_to_str(value: &str) -> String {
    if value.is_empty() {
        "(empty)".to_string()
    } else {
        // Escape nulls so that github renders them correctly in the webui
        value.trim_end_matches('\n').replace('\u{0000}', "\\0")
    }
}

fn f32_to_str(value: f32) -> String {
    if value.is_nan() {
        // The sign of NaN can be different depending on platform.
        "NaN".to_string()
    } else if value == f32::INFINITY {
        "Infinity".to_string()
    } else if value == f32::NEG_INFINITY {
        "-Infinity".to_string()
    } else {
        big_decimal_to_str(&value.to_string(), 12)
    }
}

fn f64_to_str(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_string()
    } else if value == f64::INFINITY {
        "Infinity".to_string()
    } else if value == f64::NEG_INFINITY {
        "-Infinity".to_string()
    } else {
        big_decimal_to_str(&value.to_string(), 12)
    }
}

fn arrow_decimal_to_str<T: DecimalType>(value: T::Native, scale: i8) -> String {
    let precision = u8::MAX; // does not matter
    let value = T::format_decimal(value, precision, scale);
    big_decimal_to_str(&value, i64::from(scale))
}

/// Equivalent of `BigDecimal::from_str(s).round(digits).normalized().to_plain_string()`
/// for a plain decimal string `[-]digits[.digits]` (what Rust's float `Display`
/// and arrow's decimal formatting produce): round half-to-even to `digits`
/// fractional digits, drop trailing fractional zeros, print zero as `0`.
pub fn big_decimal_to_str(s: &str, digits: i64) -> String {
    let s = s.trim();
    let (neg, body) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (int_part, frac_part) = match body.split_once('.') {
        Some((i, f)) => (i, f),
        None => (body, ""),
    };
    if !int_part.bytes().chain(frac_part.bytes()).all(|b| b.is_ascii_digit()) || body.contains('e') {
        return s.to_string();
    }
    // All digits, and how many of them are fractional.
    let mut all: Vec<u8> = int_part.bytes().chain(frac_part.bytes()).map(|b| b - b'0').collect();
    let mut scale = frac_part.len() as i64;
    if digits >= 0 && scale > digits {
        let drop = (scale - digits) as usize;
        let keep_len = all.len() - drop;
        let first_dropped = all[keep_len];
        let rest_nonzero = all[keep_len + 1..].iter().any(|&d| d != 0);
        let last_kept = if keep_len > 0 { all[keep_len - 1] } else { 0 };
        let round_up = first_dropped > 5 || (first_dropped == 5 && (rest_nonzero || last_kept % 2 == 1));
        all.truncate(keep_len);
        if all.is_empty() {
            all.push(0);
        }
        if round_up {
            let mut i = all.len();
            loop {
                if i == 0 {
                    all.insert(0, 1);
                    break;
                }
                i -= 1;
                if all[i] == 9 {
                    all[i] = 0;
                } else {
                    all[i] += 1;
                    break;
                }
            }
        }
        scale = digits;
    }
    // normalized(): strip trailing fractional zeros.
    while scale > 0 && all.last() == Some(&0) && all.len() > 1 {
        all.pop();
        scale -= 1;
    }
    if scale > 0 && all.len() == 1 && all[0] == 0 {
        scale = 0;
    }
    let is_zero = all.iter().all(|&d| d == 0);
    let scale = scale as usize;
    // Pad so there is at least one integer digit.
    while all.len() <= scale {
        all.insert(0, 0);
    }
    let split = all.len() - scale;
    let mut int_digits: String = all[..split].iter().map(|d| (b'0' + d) as char).collect();
    let trimmed = int_digits.trim_start_matches('0');
    int_digits = if trimmed.is_empty() { "0".to_string() } else { trimmed.to_string() };
    let mut out = String::new();
    if neg && !is_zero {
        out.push('-');
    }
    out.push_str(&int_digits);
    if scale > 0 {
        out.push('.');
        out.extend(all[split..].iter().map(|d| (b'0' + d) as char));
    }
    out
}

/// Converts `batches` to a result as expected by sqllogictest.
///
/// `path_replacements` are `(from, to)` pairs applied to every cell (DataFusion
/// replaces its workspace root with `WORKSPACE_ROOT`).
pub fn convert_batches(
    schema: &Schema,
    batches: Vec<RecordBatch>,
    path_replacements: &[(String, String)],
) -> Result<Vec<Vec<String>>, DataFusionError> {
    let mut rows = vec![];
    for batch in batches {
        // Verify schema
        if !schema.contains(&batch.schema()) {
            return Err(DataFusionError::Internal(format!(
                "Schema mismatch. Previously had\n{:#?}\n\nGot:\n{:#?}",
                &schema,
                batch.schema()
            )));
        }
        for row in 0..batch.num_rows() {
            let cells = batch
                .columns()
                .iter()
                .map(|col| cell_to_string(col, row))
                .collect::<Result<Vec<String>, ArrowError>>()?;
            for mut expanded in expand_row(cells) {
                for cell in expanded.iter_mut() {
                    for (from, to) in path_replacements {
                        if !from.is_empty() && cell.contains(from.as_str()) {
                            *cell = cell.replace(from.as_str(), to);
                        }
                    }
                }
                rows.push(expanded);
            }
        }
    }
    Ok(rows)
}

/// Special case rows that have newlines in the last cell (like explain plans):
/// one row per line, leading spaces replaced by `-` and each line numbered.
fn expand_row(mut row: Vec<String>) -> Vec<Vec<String>> {
    if let Some(cell) = row.pop() {
        let lines: Vec<_> = cell.split('\n').collect();
        if lines.len() < 2 {
            row.push(cell);
            return vec![row];
        }
        let mut out = vec![row];
        for (idx, l) in lines.into_iter().enumerate() {
            let content = l.trim_start();
            let new_prefix = "-".repeat(l.len() - content.len());
            let line_num = idx + 1;
            out.push(vec![format!("{line_num:02}){new_prefix}{content}")]);
        }
        out
    } else {
        vec![row]
    }
}

macro_rules! get_row_value {
    ($array_type:ty, $column: ident, $row: ident) => {{
        let array = $column.as_any().downcast_ref::<$array_type>().unwrap();
        array.value($row)
    }};
}

/// Normalizes the content of a single cell prior to printing (NULL, empty
/// strings, float rounding), as DataFusion's engine does.
pub fn cell_to_string(col: &ArrayRef, row: usize) -> Result<String, ArrowError> {
    if col.is_null(row) {
        return Ok(NULL_STR.to_string());
    }
    Ok(match col.data_type() {
        DataType::Null => NULL_STR.to_string(),
        DataType::Boolean => bool_to_str(get_row_value!(array::BooleanArray, col, row)),
        // half's Display prints the value as an f32.
        DataType::Float16 => f32_to_str(get_row_value!(array::Float16Array, col, row).to_f32()),
        DataType::Float32 => f32_to_str(get_row_value!(array::Float32Array, col, row)),
        DataType::Float64 => f64_to_str(get_row_value!(array::Float64Array, col, row)),
        DataType::Decimal32(_, scale) => {
            arrow_decimal_to_str::<Decimal32Type>(get_row_value!(array::Decimal32Array, col, row), *scale)
        }
        DataType::Decimal64(_, scale) => {
            arrow_decimal_to_str::<Decimal64Type>(get_row_value!(array::Decimal64Array, col, row), *scale)
        }
        DataType::Decimal128(_, scale) => {
            arrow_decimal_to_str::<Decimal128Type>(get_row_value!(array::Decimal128Array, col, row), *scale)
        }
        DataType::Decimal256(_, scale) => {
            arrow_decimal_to_str::<Decimal256Type>(get_row_value!(array::Decimal256Array, col, row), *scale)
        }
        DataType::LargeUtf8 => varchar_to_str(get_row_value!(array::LargeStringArray, col, row)),
        DataType::Utf8 => varchar_to_str(get_row_value!(array::StringArray, col, row)),
        DataType::Utf8View => varchar_to_str(get_row_value!(array::StringViewArray, col, row)),
        DataType::Dictionary(_, _) => {
            let dict = col.as_any_dictionary();
            let key = dict.normalized_keys()[row];
            return cell_to_string(dict.values(), key);
        }
        _ => {
            let mut datafusion_format_options = datafusion::config::FormatOptions::default();
            datafusion_format_options.set("null", "NULL").unwrap();
            let arrow_format_options: datafusion::arrow::util::display::FormatOptions =
                (&datafusion_format_options).try_into().unwrap();
            let f = ArrayFormatter::try_new(col.as_ref(), &arrow_format_options)?;
            f.value(row).to_string()
        }
    })
}

/// Converts columns to a result as expected by sqllogictest.
pub fn convert_schema_to_types(columns: &Fields) -> Vec<DFColumnType> {
    columns
        .iter()
        .map(|f| match f.data_type() {
            DataType::Boolean => DFColumnType::Boolean,
            DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64 => DFColumnType::Integer,
            DataType::Float16 | DataType::Float32 | DataType::Float64 => DFColumnType::Float,
            DataType::Decimal32(_, _)
            | DataType::Decimal64(_, _)
            | DataType::Decimal128(_, _)
            | DataType::Decimal256(_, _) => DFColumnType::Float,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => DFColumnType::Text,
            DataType::Date32 | DataType::Date64 | DataType::Time32(_) | DataType::Time64(_) => DFColumnType::DateTime,
            DataType::Timestamp(_, _) => DFColumnType::Timestamp,
            DataType::Dictionary(key_type, value_type) => {
                if key_type.is_integer() {
                    match value_type.as_ref() {
                        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => DFColumnType::Text,
                        _ => DFColumnType::Another,
                    }
                } else {
                    DFColumnType::Another
                }
            }
            _ => DFColumnType::Another,
        })
        .collect()
}

/// Trailing whitespace from lines in SLT will typically be removed, but do not
/// fail if it is not.
#[allow(clippy::ptr_arg)]
pub fn value_normalizer(s: &String) -> String {
    s.trim_end().to_string()
}

/// Validate the actual and expected values (DataFusion's `df_value_validator`,
/// with `<slt:ignore>` support).
pub fn df_value_validator(normalizer: sqllogictest::Normalizer, actual: &[Vec<String>], expected: &[String]) -> bool {
    const IGNORE_MARKER: &str = "<slt:ignore>";
    let contains_ignore_marker = expected.iter().any(|line| line.contains(IGNORE_MARKER));

    let normalized_expected = expected.iter().map(normalizer).collect::<Vec<_>>();
    let normalized_actual =
        actual.iter().map(|strs| strs.join(" ")).map(|s| s.trim_end().to_string()).collect::<Vec<_>>();

    if contains_ignore_marker {
        let expected_snapshot = normalized_expected.join("\n");
        let actual_snapshot = normalized_actual.join("\n");
        let fragments: Vec<&str> = expected_snapshot.split(IGNORE_MARKER).collect();
        let mut pos = 0;
        for (i, frag) in fragments.iter().enumerate() {
            if frag.is_empty() {
                continue;
            }
            if let Some(idx) = actual_snapshot[pos..].find(frag) {
                if (i == 0) && (idx != 0) {
                    return false;
                }
                pos += idx + frag.len();
            } else {
                return false;
            }
        }
        return true;
    }
    normalized_actual == normalized_expected
}
