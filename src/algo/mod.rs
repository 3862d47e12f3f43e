//! Algorithms: each family has a CPU twin and a GPU implementation behind one
//! signature. Each `kernels/X.cu` has one launcher module: `select::hash`
//! (hash_setops), `select::bitmap` (bitmap_setops), `select::sort`
//! (sort_setops), and the module of the family's own name for the rest
//! (`transfer.cu`'s is `crate::gpu::transfer`, `overlap_bitmap.cu`'s is
//! `overlap`).
pub mod families;
pub mod join_filter;
pub mod list_pack;
pub mod multiset;
pub mod overlap;
pub mod radix_sort;
pub mod row_hash;
pub mod segmented;
pub mod select;
pub mod sorted_intersect;
pub mod ssjoin;
pub mod ssjoin_prep;

use datafusion::error::Result;

use crate::gpu::{Gpu, KernelSource};

/// Every kernel family, by its launcher's `KERNEL` (NVRTC compiles each with its `-D` contract).
pub fn kernel_sources() -> Vec<&'static KernelSource> {
    vec![
        &crate::gpu::transfer::KERNEL,
        &select::hash::KERNEL,
        &select::bitmap::KERNEL,
        &select::sort::KERNEL,
        &radix_sort::KERNEL,
        &row_hash::KERNEL,
        &join_filter::KERNEL,
        &families::KERNEL,
        &overlap::bitmap::KERNEL,
        &overlap::search::KERNEL,
        &sorted_intersect::KERNEL,
        &segmented::KERNEL,
        &multiset::KERNEL,
        &ssjoin::gpu::KERNEL,
        &ssjoin_prep::KERNEL,
        &crate::scan::decode::KERNEL,
        &crate::scan::decode::ZSTD_KERNEL,
    ]
}

/// What a query planned onto the device loads while the device starts: the
/// set selection's families ([`SET_SELECTION_KERNELS`], first), then the
/// device Parquet scan's (else its first decode waits ~12 ms for it).
pub static QUERY_KERNELS: [&KernelSource; 4] =
    [&crate::gpu::transfer::KERNEL, &select::bitmap::KERNEL, &select::hash::KERNEL, &crate::scan::decode::KERNEL];

/// The families a device's background start loads: the set selection's.
pub static SET_SELECTION_KERNELS: &[&KernelSource] = QUERY_KERNELS.split_at(3).0;

/// What a similarity join planned onto the device loads while the device
/// starts: the transfers', the join's and its preprocessing's families.
pub static SIMILARITY_KERNELS: [&KernelSource; 3] =
    [&crate::gpu::transfer::KERNEL, &ssjoin::gpu::KERNEL, &ssjoin_prep::KERNEL];

/// A kernel family's self-check against its CPU twin (run by `setfusion doctor`).
pub type SelfCheck = fn(&Gpu) -> Result<String>;

/// Every family's self-check, by kernel family name.
pub fn self_checks() -> Vec<(&'static str, SelfCheck)> {
    vec![
        ("families", families::self_check as SelfCheck),
        ("multiset", multiset::self_check as SelfCheck),
        ("overlap_bitmap + overlap_search", overlap::self_check as SelfCheck),
        ("hash_setops + bitmap_setops", select::self_check as SelfCheck),
        ("join_filter", join_filter::self_check as SelfCheck),
        ("radix_sort", radix_sort::self_check as SelfCheck),
        ("row_hash", row_hash::self_check as SelfCheck),
        ("sort_setops", select::sort::self_check as SelfCheck),
        ("sorted_intersect", sorted_intersect::self_check as SelfCheck),
        ("ssjoin", ssjoin::self_check as SelfCheck),
        ("ssjoin_prep", ssjoin_prep::self_check as SelfCheck),
        ("parquet_decode", crate::scan::decode::self_check as SelfCheck),
    ]
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    /// Every `kernels/*.cu` file has one launcher, and each family's contract
    /// comes from the host alone: NVRTC sees no file system (so a family must
    /// include common.cuh, which the runtime inlines), and no `-D` name is
    /// also defined in the source (a second copy of a number).
    #[test]
    fn kernel_families_and_their_contracts() {
        let sources = super::kernel_sources();
        let families: HashSet<&str> = sources.iter().map(|k| k.family).collect();
        assert_eq!(families.len(), sources.len(), "a family is listed twice");
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(family) = name.strip_suffix(".cu") {
                assert!(families.contains(family), "kernels/{name} has no launcher in algo::kernel_sources()");
            }
        }
        for k in sources {
            assert!(
                k.source.contains("#include \"common.cuh\""),
                "kernels/{}.cu does not #include \"common.cuh\"",
                k.family
            );
            for (name, _) in (k.defines)() {
                assert!(
                    !k.source.contains(&format!("#define {name} ")),
                    "kernels/{}.cu defines {name}, which the host passes",
                    k.family
                );
            }
        }
    }

    /// Every family compiles with NVRTC for sm_90 (the H100) with its `-D`
    /// contract, here too when NVRTC alone is installed (no GPU needed); the
    /// device's `doctor` compiles them again for its own architecture.
    #[test]
    fn kernels_compile_with_nvrtc() {
        for k in super::kernel_sources() {
            match crate::gpu::check_compiles(k, "compute_90") {
                None => {
                    use std::io::Write;
                    let _ = writeln!(std::io::stderr(), "skipping the NVRTC compile check: libnvrtc not found");
                    return;
                }
                Some(r) => r.unwrap_or_else(|e| panic!("{e}")),
            }
        }
    }
}
