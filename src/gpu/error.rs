//! Typed device errors. Every failure the device runtime reports is a
//! [`GpuError`]; it travels inside `DataFusionError::External` through the
//! algorithms' `Result`s (which also carry Arrow and planning errors), and the
//! operators ask [`GpuError::find`] what happened (partition, fall back to the
//! CPU twin, or fail) instead of matching message text.

use std::fmt;

use cudarc::driver::sys::CUresult;
use cudarc::driver::DriverError;
use datafusion::error::DataFusionError;

use super::Unavailable;

/// What went wrong on the device.
#[derive(Debug)]
pub enum GpuError {
    /// The driver could not allocate device memory.
    OutOfMemory { what: String },
    /// The operator's device budget (`setfusion.memory_limit`) is smaller than
    /// what this step needs: partition, or run on the CPU.
    OverBudget { what: String, need: usize, available: usize },
    /// Any other driver call failed.
    Driver { what: String, error: DriverError },
    /// No usable device (no driver, no device, no NVRTC, disabled).
    Unavailable(Unavailable),
    /// A kernel family failed to compile or load, or a kernel's input is out
    /// of its supported range.
    Kernel { family: String, detail: String },
}

impl GpuError {
    /// A failed driver call: out of memory, or another driver error.
    pub fn driver(what: &str, error: DriverError) -> Self {
        if error.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            GpuError::OutOfMemory { what: what.to_string() }
        } else {
            GpuError::Driver { what: what.to_string(), error }
        }
    }

    /// A step needing `need` device bytes when `available` are left in the budget.
    pub fn over_budget(what: impl Into<String>, need: usize, available: usize) -> Self {
        GpuError::OverBudget { what: what.into(), need, available }
    }

    /// The device error inside `e` (through DataFusion's context and shared wrappers), if any.
    pub fn find(e: &DataFusionError) -> Option<&GpuError> {
        match e {
            DataFusionError::External(inner) => inner.downcast_ref::<GpuError>(),
            DataFusionError::Context(_, inner) => GpuError::find(inner),
            DataFusionError::Shared(inner) => GpuError::find(inner),
            _ => None,
        }
    }

    /// Does more device memory (a smaller partition, or none: the CPU) avoid this error?
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, GpuError::OutOfMemory { .. } | GpuError::OverBudget { .. })
    }
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuError::OutOfMemory { what } => write!(f, "setfusion GPU: out of device memory: {what}"),
            GpuError::OverBudget { what, need, available } => {
                write!(
                    f,
                    "setfusion GPU: device memory budget exceeded: {what} needs {need} bytes, {available} available"
                )
            }
            GpuError::Driver { what, error } => write!(f, "setfusion GPU: {what} failed: {error}"),
            GpuError::Unavailable(u) => write!(f, "setfusion GPU: {u}"),
            GpuError::Kernel { family, detail } => write!(f, "setfusion GPU: kernels/{family}.cu: {detail}"),
        }
    }
}

impl std::error::Error for GpuError {}

impl From<GpuError> for DataFusionError {
    fn from(e: GpuError) -> Self {
        DataFusionError::External(Box::new(e))
    }
}

impl From<Unavailable> for GpuError {
    fn from(u: Unavailable) -> Self {
        GpuError::Unavailable(u)
    }
}

/// Is `e` a device out-of-memory or over-budget error (so the caller may partition or fall back)?
pub fn is_out_of_memory(e: &DataFusionError) -> bool {
    GpuError::find(e).is_some_and(GpuError::is_out_of_memory)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_found_by_kind_not_text() {
        let oom: DataFusionError = GpuError::driver("alloc", DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY)).into();
        assert!(is_out_of_memory(&oom));
        let wrapped = DataFusionError::Shared(std::sync::Arc::new(oom.context("while selecting")));
        assert!(is_out_of_memory(&wrapped));
        assert!(is_out_of_memory(&GpuError::over_budget("a table", 10, 5).into()));
        // The old message text alone no longer counts.
        assert!(!is_out_of_memory(&DataFusionError::Execution("device memory budget exceeded".into())));
        let other: DataFusionError = GpuError::driver("launch", DriverError(CUresult::CUDA_ERROR_LAUNCH_FAILED)).into();
        assert!(!is_out_of_memory(&other));
        assert!(matches!(GpuError::find(&other), Some(GpuError::Driver { .. })));
    }
}
