//! NVRTC compilation of the embedded `kernels/*.cu` to native code (CUBIN),
//! with an on-disk cache.
//!
//! Kernels are compiled at run time for the device's own architecture, so the
//! build needs no CUDA. The cache key covers the source, the architecture, the
//! driver version and the NVRTC version; every cached file carries a checksum
//! of its body and is recompiled if it does not verify.

use std::fmt;
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
    KernelSource { family: "ssjoin_prep", source: include_str!("../../kernels/ssjoin_prep.cu") },
    KernelSource { family: "sort_setops", source: include_str!("../../kernels/sort_setops.cu") },
    KernelSource { family: "radix_sort", source: include_str!("../../kernels/radix_sort.cu") },
    KernelSource { family: "multiset", source: include_str!("../../kernels/multiset.cu") },
    KernelSource { family: "row_hash", source: include_str!("../../kernels/row_hash.cu") },
    KernelSource { family: "transfer", source: include_str!("../../kernels/transfer.cu") },
    KernelSource { family: "families", source: include_str!("../../kernels/families.cu") },
    KernelSource { family: "join_filter", source: include_str!("../../kernels/join_filter.cu") },
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

/// setfusion's folder in the user's cache (`$XDG_CACHE_HOME/setfusion`, else
/// `~/.cache/setfusion`): kernels, the doctor's calibration.
pub fn setfusion_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("setfusion"))
}

fn cache_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("SETFUSION_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    Some(setfusion_cache_dir()?.join("kernels"))
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

/// The cache key of a family's code: source, architecture, driver and NVRTC versions.
fn cache_key(src: &str, info: &DeviceInfo) -> u64 {
    let (maj, min) = info.compute_capability;
    let (nv_maj, nv_min) = nvrtc_version();
    fnv1a(&[src.as_bytes(), format!("sm_{maj}{min}/driver{}/nvrtc{nv_maj}.{nv_min}", info.driver_version).as_bytes()])
}

fn nvrtc_failed(k: &KernelSource, what: &str, detail: impl fmt::Display) -> DataFusionError {
    DataFusionError::Execution(format!("setfusion GPU: NVRTC {what} failed on kernels/{}.cu: {detail}", k.family))
}

const OPTIONS: [&str; 2] = ["-std=c++17", "--extra-device-vectorization"];

/// Native code (CUBIN) of a family for `info`'s architecture, through the disk
/// cache: loading it needs no JIT, where PTX costs the driver a compile in
/// every process (issue 13). Cached files carry a checksum of their bytes and
/// are recompiled when it does not verify.
pub fn compile_cached(k: &KernelSource, info: &DeviceInfo) -> Result<Ptx, DataFusionError> {
    let src = full_source(k);
    let key = cache_key(&src, info);
    let path = cache_dir().map(|d| d.join(format!("{}-{key:016x}.cubin", k.family)));
    if let Some(p) = &path {
        if let Ok(bytes) = std::fs::read(p) {
            if bytes.len() > 8 && bytes[..8] == fnv1a(&[&bytes[8..]]).to_le_bytes() {
                return Ok(Ptx::from_binary(bytes[8..].to_vec()));
            }
            // Corrupt or truncated: fall through and recompile.
        }
    }
    let (maj, min) = info.compute_capability;
    let cubin = nvrtc_cubin(k, &src, &format!("--gpu-architecture=sm_{maj}{min}"))?;
    if let Some(p) = &path {
        // A cache write failure only costs a recompile next time.
        if let Some(dir) = p.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        let mut file = fnv1a(&[&cubin]).to_le_bytes().to_vec();
        file.extend_from_slice(&cubin);
        if std::fs::write(&tmp, file).is_ok() {
            let _ = std::fs::rename(&tmp, p);
        }
    }
    Ok(Ptx::from_binary(cubin))
}

/// Compile `src` to CUBIN with NVRTC's C API (cudarc's safe API returns only PTX).
fn nvrtc_cubin(k: &KernelSource, src: &str, arch: &str) -> Result<Vec<u8>, DataFusionError> {
    use cudarc::nvrtc::{result, sys};
    let csrc = std::ffi::CString::new(src).map_err(|e| nvrtc_failed(k, "source", e))?;
    let name = std::ffi::CString::new(format!("{}.cu", k.family)).map_err(|e| nvrtc_failed(k, "name", e))?;
    let prog = result::create_program(&csrc, Some(&name)).map_err(|e| nvrtc_failed(k, "create", e))?;
    let mut options: Vec<String> = OPTIONS.iter().map(|o| o.to_string()).collect();
    options.push(arch.to_string());
    // SAFETY: `prog` was created above and is destroyed once, at the end of this block.
    let out = unsafe {
        let compiled = result::compile_program(prog, &options).map_err(|e| {
            let log = result::get_program_log(prog)
                .map(|l| std::ffi::CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
                .unwrap_or_default();
            nvrtc_failed(k, "compile", format!("{e}: {log}"))
        });
        let cubin = compiled.and_then(|()| {
            let mut size = 0usize;
            sys::nvrtcGetCUBINSize(prog, &mut size).result().map_err(|e| nvrtc_failed(k, "CUBIN size", e))?;
            let mut bytes = vec![0u8; size];
            sys::nvrtcGetCUBIN(prog, bytes.as_mut_ptr() as *mut std::ffi::c_char)
                .result()
                .map_err(|e| nvrtc_failed(k, "CUBIN", e))?;
            Ok(bytes)
        });
        let _ = result::destroy_program(prog);
        cubin
    };
    out
}

/// PTX of a family for `info`'s virtual architecture (JIT-compiled by the
/// driver at load): the fallback when the driver refuses NVRTC's native code.
pub fn compile_ptx(k: &KernelSource, info: &DeviceInfo) -> Result<Ptx, DataFusionError> {
    let (maj, min) = info.compute_capability;
    let arch: &'static str = Box::leak(format!("compute_{maj}{min}").into_boxed_str());
    let opts = CompileOptions {
        arch: Some(arch),
        options: OPTIONS.iter().map(|o| o.to_string()).collect(),
        name: Some(format!("{}.cu", k.family)),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(full_source(k), opts).map_err(|e| {
        let detail = match &e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        };
        nvrtc_failed(k, "compile", detail)
    })
}

#[cfg(test)]
mod tests {
    /// NVRTC sees no file system: a family that does not include common.cuh
    /// (which the runtime inlines) fails only on a GPU machine.
    #[test]
    fn every_family_includes_the_common_header() {
        for k in super::kernel_sources() {
            assert!(k.source.contains("#include \"common.cuh\""), "kernels/{}.cu does not #include \"common.cuh\"", k.family);
        }
    }
}
