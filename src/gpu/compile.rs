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

/// One algorithm family: one `.cu` file, declared by its Rust launcher module
/// (a `static KERNEL`), which also owns the family's contract with the host:
/// tuning constants and op codes reach NVRTC as `-D` options from the Rust
/// constants the launcher uses, so no number is written twice.
#[derive(Debug)]
pub struct KernelSource {
    pub family: &'static str,
    pub source: &'static str,
    /// `-DNAME=value` options for the compiler.
    pub defines: fn() -> Vec<(String, u64)>,
}

impl KernelSource {
    /// The family's `-D` options.
    pub fn define_options(&self) -> Vec<String> {
        (self.defines)()
            .into_iter()
            .map(|(name, v)| if v > i32::MAX as u64 { format!("-D{name}={v}ULL") } else { format!("-D{name}={v}") })
            .collect()
    }
}

/// A family without host-supplied constants.
pub fn no_defines() -> Vec<(String, u64)> {
    Vec::new()
}

/// `(name, value)` pairs as `-D` defines, the names prefixed.
pub fn prefixed(prefix: &str, pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
    pairs.iter().map(|(n, v)| (format!("{prefix}{n}"), *v)).collect()
}

const COMMON: &str = include_str!("../../kernels/common.cuh");

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
    let base = crate::env::user_cache_dir()?;
    Some(base.join("setfusion"))
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = crate::env::kernel_cache_dir() {
        return Some(d);
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
/// With `SETFUSION_KERNEL_SOURCE_DIR` set, the family's file and the header
/// are read from there (a development knob; see [`crate::env::kernel_source_dir`]).
pub fn full_source(k: &KernelSource) -> String {
    let from_dir =
        |name: &str| crate::env::kernel_source_dir().and_then(|d| std::fs::read_to_string(d.join(name)).ok());
    let source = from_dir(&format!("{}.cu", k.family)).unwrap_or_else(|| k.source.to_string());
    let common = from_dir("common.cuh").unwrap_or_else(|| COMMON.to_string());
    source.replace("#include \"common.cuh\"", &common)
}

/// The cache key of a family's code: source, architecture, driver and NVRTC versions.
fn cache_key(k: &KernelSource, src: &str, info: &DeviceInfo) -> u64 {
    let (maj, min) = info.compute_capability;
    let (nv_maj, nv_min) = nvrtc_version();
    let defines = k.define_options().join(" ");
    fnv1a(&[
        src.as_bytes(),
        defines.as_bytes(),
        format!("sm_{maj}{min}/driver{}/nvrtc{nv_maj}.{nv_min}", info.driver_version).as_bytes(),
    ])
}

fn nvrtc_failed(k: &KernelSource, what: &str, detail: impl fmt::Display) -> DataFusionError {
    super::GpuError::Kernel { family: k.family.to_string(), detail: format!("NVRTC {what} failed: {detail}") }.into()
}

const OPTIONS: [&str; 2] = ["-std=c++17", "--extra-device-vectorization"];

/// Native code (CUBIN) of a family for `info`'s architecture, through the disk
/// cache: loading it needs no JIT, where PTX costs the driver a compile in
/// every process (issue 13). Cached files carry a checksum of their bytes and
/// are recompiled when it does not verify.
pub fn compile_cached(k: &KernelSource, info: &DeviceInfo) -> Result<Ptx, DataFusionError> {
    let src = full_source(k);
    let key = cache_key(k, &src, info);
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
    options.extend(k.define_options());
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

/// Compile a family to PTX for `arch` (e.g. `compute_90`) without a device:
/// the check that the kernels and their `-D` contracts compile, wherever
/// NVRTC alone is installed. None when NVRTC cannot be loaded.
pub fn check_compiles(k: &KernelSource, arch: &'static str) -> Option<Result<(), DataFusionError>> {
    if !super::nvrtc_present() {
        return None;
    }
    let opts = CompileOptions {
        arch: Some(arch),
        options: OPTIONS.iter().map(|o| o.to_string()).chain(k.define_options()).collect(),
        name: Some(format!("{}.cu", k.family)),
        ..Default::default()
    };
    Some(cudarc::nvrtc::compile_ptx_with_opts(full_source(k), opts).map(|_| ()).map_err(|e| {
        let detail = match &e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        };
        nvrtc_failed(k, "compile", detail)
    }))
}

/// PTX of a family for `info`'s virtual architecture (JIT-compiled by the
/// driver at load): the fallback when the driver refuses NVRTC's native code.
pub fn compile_ptx(k: &KernelSource, info: &DeviceInfo) -> Result<Ptx, DataFusionError> {
    let (maj, min) = info.compute_capability;
    let arch: &'static str = Box::leak(format!("compute_{maj}{min}").into_boxed_str());
    let opts = CompileOptions {
        arch: Some(arch),
        options: OPTIONS.iter().map(|o| o.to_string()).chain(k.define_options()).collect(),
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
