//! The `setfusion` command line (see `setfusion --help`).
fn main() {
    setfusion_tools::cli::main()
}
