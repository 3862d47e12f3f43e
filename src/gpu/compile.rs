//! NVRTC compilation of the embedded `kernels/*.cu` with an on-disk PTX cache.
//!
//! Kernels are compiled at run time for the device's own architecture, so the
//! build needs no CUDA. The cache key covers the source, the architecture, the
//! driver version and the NVRTC version; every cached file carries a checksum
//! of its body and is recompiled if it does not verify.

use std::path::PathBuf;

use cudarc::nvrtc::{CompileOptions, Ptx};
use datafusion::error::DataFusionError;

use super::DeviceInfo;

/// One algorithm family: one `.cu` file.
#[derive(Debug)]
pub struct KernelSource {
    pub family: &'static str,
    pub source: &'static str,
}

const COMMON: &str = include_str!("../../kernels/common.cuh");

static SOURCES: &[KernelSource] = &[
    KernelSource { family: "sorted_intersect", source: include_str!("../../kernels/sorted_intersect.cu") },
    KernelSource { family: "hash_setops", source: include_str!("../../kernels/hash_setops.cu") },
    KernelSource { family: "bitmap_setops", source: include_str!("../../kernels/bitmap_setops.cu") },
    KernelSource { family: "ssjoin", source: include_str!("../../kernels/ssjoin.cu") },
    KernelSource { family: "sort_setops", source: include_str!("../../kernels/sort_setops.cu") },
    KernelSource { family: "row_hash", source: include_str!("../../kernels/row_hash.cu") },
    KernelSource { family: "transfer", source: include_str!("../../kernels/transfer.cu") },
];

/// Every embedded kernel family.
pub fn kernel_sources() -> &'static [KernelSource] {
    SOURCES
}

/// FNV-1a, 64-bit: stable across builds and platforms (the cache key must be).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in *p {
            h ^= *b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn cache_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("SETFUSION_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("setfusion").join("kernels"))
}

fn nvrtc_version() -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: out-parameter query; libnvrtc presence was checked by `Gpu::open`.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (major, minor)
}

/// Full source text of a family, with the shared header inlined (NVRTC has no
/// file system access to our `kernels/` folder once the binary is installed).
pub fn full_source(k: &KernelSource) -> String {
    k.source.replace("#include \"common.cuh\"", COMMON)
}

/// Compile a family for `info`'s architecture, going through the disk cache.
pub fn compile_cached(k: &KernelSource, info: &DeviceInfo) -> Result<Ptx, DataFusionError> {
    let src = full_source(k);
    let (maj, min) = info.compute_capability;
    let (nv_maj, nv_min) = nvrtc_version();
    let key = fnv1a(&[
        src.as_bytes(),
        format!("sm_{maj}{min}/driver{}/nvrtc{nv_maj}.{nv_min}", info.driver_version).as_bytes(),
    ]);
    let path = cache_dir().map(|d| d.join(format!("{}-{key:016x}.ptx", k.family)));
    if let Some(p) = &path {
        if let Ok(text) = std::fs::read_to_string(p) {
            if let Some((header, body)) = text.split_once('\n') {
                if header == format!("// setfusion {:016x}", fnv1a(&[body.as_bytes()])) {
                    return Ok(Ptx::from_src(body.to_string()));
                }
            }
            // Corrupt or truncated: fall through and recompile.
        }
    }
    let arch: &'static str = Box::leak(format!("compute_{maj}{min}").into_boxed_str());
    let opts = CompileOptions {
        arch: Some(arch),
        options: vec!["-std=c++17".into(), "--extra-device-vectorization".into()],
        name: Some(format!("{}.cu", k.family)),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(&src, opts).map_err(|e| {
        let detail = match &e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        };
        DataFusionError::Execution(format!("setfusion GPU: NVRTC failed on kernels/{}.cu: {detail}", k.family))
    })?;
    let body = ptx.to_src();
    if let Some(p) = &path {
        // A cache write failure only costs a recompile next time.
        if let Some(dir) = p.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        let text = format!("// setfusion {:016x}\n{body}", fnv1a(&[body.as_bytes()]));
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, p);
        }
    }
    Ok(Ptx::from_src(body))
}
