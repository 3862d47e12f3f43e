#!/usr/bin/env python3
"""Small Parquet fixture files written by pyarrow and by DuckDB (issue 27).

What it writes: tests/data/parquet/*.parquet (it deletes the .parquet files
there first; the README beside them is kept up to date by hand). Every file
holds the same kind of table, 600 to 1500 rows, mostly in several row groups,
with values that repeat (so the dictionary encoders are used; k and d come in
runs, so dictionary indices hold RLE runs):

    k  BIGINT          (INT64)           ~10% NULL; 120 values around 0 and one beyond 32 bits  (the key)
    i  INTEGER         (INT32)           ~20% NULL; 40 values, INT32's minimum and maximum among them
    d  DATE            (INT32 DATE)      no NULL; 60 days before and after 1970
    m  DECIMAL(12, 2)  (INT64 DECIMAL)   ~15% NULL; 41 values, beyond 32 bits
    s  DECIMAL(7, 2)   (INT32 DECIMAL)   no NULL; 31 values, negative ones too
    v  VARCHAR         (BYTE_ARRAY)      not read by the device scan
    l  LIST<INTEGER>   (nested)          not read by the device scan: skipped beside the others

pyarrow writes d REQUIRED (a non-nullable field) and the other columns
OPTIONAL (one file, with a row group NULL in every column, has d OPTIONAL
too); DuckDB writes d and s REQUIRED (they hold no NULL) and the rest
OPTIONAL. Decimals are stored as INT32 / INT64 (pyarrow's
store_decimal_as_integer=True; DuckDB does so by itself up to 18 digits).

The variants (writer options) are listed in files() below and in
tests/data/parquet/README.md. src/scan/foreign_fixtures.rs checks
setfusion's host decoder (`scan::scan_to_host`) against arrow-rs's reader on
every column of a supported type of every file.

The committed files were made with:

    Python 3.11.7, pyarrow 26.0.1, duckdb 2.0.1

Rerun (from the repository root; it overwrites the files, then commit them):

    pip install duckdb==2.0.1 pyarrow==26.0.1
    python3 scripts/make-parquet-fixtures.py

The data is deterministic (its own xorshift generator, no numpy), and so are
the files for a given pair of versions (DuckDB runs on one thread); another
version may write different bytes (encodings, page sizes), so rerun the test
after a rerun with other versions. `--inspect` prints every file's row groups
and each column chunk's encodings and page kinds instead of writing.
"""

import datetime
import decimal
import os
import sys

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "parquet")
OUT = os.path.normpath(OUT)

ROWS = 1000


def schema(date_nullable):
    return pa.schema(
        [
            pa.field("k", pa.int64()),
            pa.field("i", pa.int32()),
            pa.field("d", pa.date32(), nullable=date_nullable),
            pa.field("m", pa.decimal128(12, 2)),
            pa.field("s", pa.decimal128(7, 2)),
            pa.field("v", pa.string()),
            pa.field("l", pa.list_(pa.int32())),
        ]
    )


def rows(n, seed=1, null_rows=None, unique_keys=False):
    """n rows of the table as column lists. `null_rows`: a range of rows NULL in every column;
    `unique_keys`: k and m (almost) all distinct, so that DuckDB does not choose a dictionary."""
    x = (0x9E3779B97F4A7C15 ^ (seed * 0x100000001B3)) & 0xFFFFFFFFFFFFFFFF

    def nxt():
        nonlocal x
        x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
        return x

    epoch = datetime.date(1970, 1, 1)
    cols = {c: [] for c in "kidmsvl"}
    run, k, d = 0, 0, epoch
    for r in range(n):
        a, b = nxt(), nxt()
        # k and d come in runs of 1 to 16 rows (long runs become RLE runs of dictionary indices).
        if run == 0:
            run = 1 + (b >> 56) % 16
            # k: 120 distinct values around 0 (negative keys too), one beyond 32 bits.
            k = (a % 120) - 60
            if k == 7:
                k = -(1 << 40) - 3
            # d: 60 distinct days, before and after 1970.
            d = epoch + datetime.timedelta(days=((a >> 16) % 60) * 7 - 200)
        run -= 1
        kk = r * 7919 - (1 << 33) if unique_keys else k
        # ~10% NULL.
        cols["k"].append(None if (b % 10) == 0 else kk)
        # i: 40 distinct values, including INT32's extremes; ~20% NULL.
        iv = [-(1 << 31), (1 << 31) - 1][a % 2] if (a >> 8) % 40 == 0 else ((a >> 8) % 40) - 20
        cols["i"].append(None if (b >> 8) % 5 == 0 else iv)
        cols["d"].append(d)
        # m: DECIMAL(12, 2), 41 distinct values up to +-999,999,999.99 (beyond 32 bits); ~15% NULL.
        mv = ((a >> 24) % 41) - 20
        m = mv * 99999999999 // 20 if not unique_keys else (r * 1000003) % 999999999999 - 499999999999
        cols["m"].append(None if (b >> 16) % 7 == 0 else decimal.Decimal(m).scaleb(-2))
        # s: DECIMAL(7, 2), 31 distinct values up to +-99,999.90, no NULL.
        sv = ((a >> 32) % 31) - 15
        cols["s"].append(decimal.Decimal(sv * 666666).scaleb(-2))
        # v: 20 distinct short strings, some NULL.
        cols["v"].append(None if (b >> 24) % 9 == 0 else "v%02d" % ((a >> 40) % 20))
        # l: lists of 0 to 2 small integers, some NULL lists and NULL elements.
        ln = (b >> 32) % 4
        cols["l"].append(
            None if ln == 3 else [None if (b >> (40 + j)) % 5 == 0 else int((a >> (44 + 4 * j)) % 16) for j in range(ln)]
        )
    if null_rows is not None:
        for c in cols:
            for r in null_rows:
                cols[c][r] = None
    return cols


def table(n=ROWS, seed=1, null_rows=None, unique_keys=False):
    # The date column is required unless some row is NULL throughout.
    return pa.Table.from_pydict(rows(n, seed, null_rows, unique_keys), schema=schema(null_rows is not None))


def pyarrow_file(name, t, **opts):
    opts.setdefault("row_group_size", 400)
    opts.setdefault("store_decimal_as_integer", True)
    pq.write_table(t, os.path.join(OUT, name), **opts)


def duckdb_file(name, t, options):
    con = duckdb.connect()
    con.execute("SET threads = 1")
    con.execute("SET preserve_insertion_order = true")
    con.register("src", t)
    # Explicit types, so DuckDB's columns are BIGINT, INTEGER, DATE, DECIMAL(12,2), DECIMAL(7,2), VARCHAR, INTEGER[].
    con.execute(
        "CREATE TABLE t AS SELECT k::BIGINT AS k, i::INTEGER AS i, d::DATE AS d, m::DECIMAL(12,2) AS m, "
        "s::DECIMAL(7,2) AS s, v::VARCHAR AS v, l::INTEGER[] AS l FROM src"
    )
    path = os.path.join(OUT, name)
    con.execute(f"COPY t TO '{path}' (FORMAT parquet{', ' + options if options else ''})")
    con.close()


# (file name, writer, table, options). Names: writer, dictionary (dict / plain / dictfallback /
# delta), data page version (v1 / v2), codec, then anything else. A name holding "delta" marks a
# file with DELTA_BINARY_PACKED integer columns: the scan decodes them (its test checks that DELTA pages are there).
def files():
    base = table()
    small = table(n=600, seed=2)
    ints = {"k": "DELTA_BINARY_PACKED", "i": "DELTA_BINARY_PACKED"}
    out = []
    # Every codec with the dictionary on and off, each once with v1 and once with v2 data pages
    # (10 files rather than all 20 combinations: the files stay small).
    for n, codec in enumerate(("NONE", "SNAPPY", "ZSTD", "GZIP", "LZ4")):
        for dictionary in (True, False):
            v = ("1.0", "2.0")[(n + dictionary) % 2]
            # PLAIN files barely compress (random values): fewer rows.
            t = base if dictionary or codec in ("ZSTD", "GZIP") else small
            name = "pyarrow-%s-v%s-%s.parquet" % (
                "dict" if dictionary else "plain",
                v[0],
                "lz4raw" if codec == "LZ4" else codec.lower(),  # pyarrow's "lz4" is LZ4_RAW
            )
            out.append((name, "pyarrow", t, dict(use_dictionary=dictionary, data_page_version=v, compression=codec)))
    # Small data pages (many pages a chunk), and the page index (column and offset indexes).
    small_pages = dict(data_page_size=256, max_rows_per_page=50, write_batch_size=25, write_page_index=True)
    out.append(
        (
            "pyarrow-dict-v1-snappy-smallpages-pageindex.parquet",
            "pyarrow",
            small,
            dict(use_dictionary=True, data_page_version="1.0", compression="SNAPPY", **small_pages),
        )
    )
    out.append(
        (
            "pyarrow-plain-v2-zstd-smallpages-pageindex.parquet",
            "pyarrow",
            small,
            dict(use_dictionary=False, data_page_version="2.0", compression="ZSTD", **small_pages),
        )
    )
    # The dictionary page limit reached mid-chunk: dictionary-encoded pages, then PLAIN ones.
    fallback = dict(use_dictionary=True, dictionary_pagesize_limit=128, data_page_size=1024, write_batch_size=64)
    for v, codec in (("1.0", "SNAPPY"), ("2.0", "ZSTD")):
        name = "pyarrow-dictfallback-v%s-%s.parquet" % (v[0], codec.lower())
        out.append((name, "pyarrow", small, dict(data_page_version=v, compression=codec, **fallback)))
    # DELTA_BINARY_PACKED integers (k, i): DELTA pages the scan decodes; d, m, s are PLAIN.
    out.append(
        (
            "pyarrow-delta-v1-snappy.parquet",
            "pyarrow",
            small,
            dict(use_dictionary=False, column_encoding=ints, data_page_version="1.0", compression="SNAPPY"),
        )
    )
    # A row group (the second of three) NULL in every column; every column optional.
    out.append(
        (
            "pyarrow-dict-v1-snappy-allnull-rowgroup.parquet",
            "pyarrow",
            table(n=900, seed=3, null_rows=range(300, 600)),
            dict(row_group_size=300, compression="SNAPPY"),
        )
    )
    # No row (pyarrow writes one row group of 0 rows).
    out.append(("pyarrow-empty.parquet", "pyarrow", table(n=0), dict(compression="SNAPPY")))
    # DuckDB. ROW_GROUP_SIZE alone does not cut below DuckDB's 2048-row vectors (500 gives row
    # groups of 2048 rows); ROW_GROUP_SIZE_BYTES (DuckDB's in-memory estimate) does.
    out.append(("duckdb-default.parquet", "duckdb", base, ""))
    out.append(("duckdb-zstd.parquet", "duckdb", table(n=1500, seed=4), "COMPRESSION zstd, ROW_GROUP_SIZE_BYTES 40000"))
    out.append(
        ("duckdb-small-rowgroups.parquet", "duckdb", table(n=1500, seed=5), "ROW_GROUP_SIZE 500, ROW_GROUP_SIZE_BYTES 20000")
    )
    # PARQUET_VERSION v2: columns with a small dictionary keep it (RLE_DICTIONARY), the others are
    # DELTA_BINARY_PACKED (k and m here: nearly all distinct).
    out.append(("duckdb-parquet-v2.parquet", "duckdb", base, "PARQUET_VERSION v2"))
    out.append(("duckdb-parquet-v2-delta.parquet", "duckdb", table(seed=6, unique_keys=True), "PARQUET_VERSION v2"))
    return out


# Thrift compact protocol, enough to walk page headers (for --inspect).
def _varint(buf, pos):
    shift = value = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _zigzag(v):
    return (v >> 1) ^ -(v & 1)


def _value(buf, pos, t):
    if t in (1, 2):  # booleans inside a struct field header
        return t == 1, pos
    if t == 3:
        return buf[pos], pos + 1
    if t in (4, 5, 6):
        v, pos = _varint(buf, pos)
        return _zigzag(v), pos
    if t == 7:
        return None, pos + 8
    if t == 8:
        n, pos = _varint(buf, pos)
        return bytes(buf[pos : pos + n]), pos + n
    if t in (9, 10):
        h = buf[pos]
        pos += 1
        n, et = h >> 4, h & 0x0F
        if n == 15:
            n, pos = _varint(buf, pos)
        items = []
        for _ in range(n):
            if et in (1, 2):
                items.append(buf[pos] == 1)
                pos += 1
            else:
                v, pos = _value(buf, pos, et)
                items.append(v)
        return items, pos
    if t == 12:
        return _struct(buf, pos)
    raise ValueError("thrift type %d" % t)


def _struct(buf, pos):
    out, last = {}, 0
    while True:
        h = buf[pos]
        pos += 1
        if h == 0:
            return out, pos
        delta, t = h >> 4, h & 0x0F
        if delta == 0:
            fid, pos = _varint(buf, pos)
            fid = _zigzag(fid)
        else:
            fid = last + delta
        last = fid
        out[fid], pos = _value(buf, pos, t)


PAGE_TYPES = {0: "DATA_PAGE", 1: "INDEX_PAGE", 2: "DICTIONARY_PAGE", 3: "DATA_PAGE_V2"}
ENCODINGS = {0: "PLAIN", 2: "PLAIN_DICTIONARY", 3: "RLE", 4: "BIT_PACKED", 5: "DELTA_BINARY_PACKED",
             6: "DELTA_LENGTH_BYTE_ARRAY", 7: "DELTA_BYTE_ARRAY", 8: "RLE_DICTIONARY", 9: "BYTE_STREAM_SPLIT"}


def pages(data, cc):
    """The (page type, encoding) of every page of a column chunk, in order."""
    start = cc.dictionary_page_offset if cc.has_dictionary_page and cc.dictionary_page_offset else cc.data_page_offset
    end, pos, out = start + cc.total_compressed_size, start, []
    while pos < end:
        h, body = _struct(data, pos)
        kind = PAGE_TYPES.get(h[1], str(h[1]))
        sub = h.get(5) or h.get(7) or h.get(8) or {}
        enc = sub.get(4) if h[1] == 3 else sub.get(2)
        out.append((kind, ENCODINGS.get(enc, str(enc))))
        pos = body + h[3]
    return out


def inspect():
    for name in sorted(os.listdir(OUT)):
        if not name.endswith(".parquet"):
            continue
        path = os.path.join(OUT, name)
        data = open(path, "rb").read()
        md = pq.ParquetFile(path).metadata
        print("%s: %d bytes, %d rows, %d row groups (%s), %s" % (
            name, len(data), md.num_rows, md.num_row_groups,
            ", ".join(str(md.row_group(g).num_rows) for g in range(md.num_row_groups)), md.created_by))
        for c in range(md.num_columns):
            cc0 = md.row_group(0).column(c)
            seen = {}
            for g in range(md.num_row_groups):
                runs = []
                for p in pages(data, md.row_group(g).column(c)):
                    if runs and runs[-1][0] == p:
                        runs[-1][1] += 1
                    else:
                        runs.append([p, 1])
                seq = " ".join("%s:%s%s" % (k[0].replace("DICTIONARY_PAGE", "DICT").replace("DATA_PAGE_V2", "V2").replace("DATA_PAGE", "V1"),
                                            k[1], "x%d" % n if n > 1 else "") for k, n in runs)
                seen.setdefault(seq, []).append(g)
            print("  %-8s %-10s %-7s %s" % (cc0.path_in_schema.split(".")[0], cc0.physical_type, cc0.compression,
                                          " | ".join("rg%s: %s" % (",".join(map(str, g)), seq) for seq, g in seen.items())))


def main():
    if "--inspect" in sys.argv:
        inspect()
        return
    os.makedirs(OUT, exist_ok=True)
    for name in os.listdir(OUT):
        if name.endswith(".parquet"):
            os.remove(os.path.join(OUT, name))
    total = 0
    for name, writer, t, opts in files():
        if writer == "pyarrow":
            pyarrow_file(name, t, **opts)
        else:
            duckdb_file(name, t, opts)
        size = os.path.getsize(os.path.join(OUT, name))
        total += size
        print("%-52s %7d bytes" % (name, size))
    print("total %d bytes" % total)


if __name__ == "__main__":
    main()
