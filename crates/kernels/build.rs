//! Builds the CUDA half of the kernels (`cuda/*.cu`), and the host mirror of their shared
//! arithmetic (`cuda/common.cuh` through `cuda/host_mirror.cpp`) that the CPU tests compare with
//! the Rust kernels.
//!
//! With the `cuda` feature each `cuda/NAME.cu` becomes `$OUT_DIR/NAME.ptx` through nvcc at build
//! time, as candle-kernels does, rather than through NVRTC at run time: a kernel that does not
//! compile fails the build here (on a machine without a GPU), the run pays no compilation at
//! start, and the run-time image needs no NVRTC library. nvcc comes from `$CUDA_ROOT/bin` (or
//! `$CUDA_PATH/bin`, else the PATH); the target is `compute_$CUDA_COMPUTE_CAP` (e.g. 90 for an
//! H100), else what `nvidia-smi` reports. `--fmad=false` keeps every multiply and add rounded
//! separately, as on the CPU: these kernels are bound by memory, not arithmetic, and elementwise
//! ops (AdamW, dropout, the activations) then give the CPU's bits.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=cuda");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=CUDA_ROOT");
    println!("cargo:rerun-if-env-changed=CUDA_PATH");

    cc::Build::new()
        .cpp(true)
        .files(files_ending("cpp"))
        .flag_if_supported("-std=c++17")
        // The Rust CPU kernels never contract a·b + c into one rounding; neither may the mirror.
        .flag_if_supported("-ffp-contract=off")
        .compile("ember_cuda_host_mirror");

    if env::var_os("CARGO_FEATURE_CUDA").is_some() {
        build_ptx();
    }
}

fn build_ptx() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let nvcc = nvcc();
    let cap = compute_cap();
    for src in files_ending("cu") {
        let stem = src.file_stem().unwrap().to_string_lossy().into_owned();
        let ptx = out.join(format!("{stem}.ptx"));
        let status = Command::new(&nvcc)
            .args(["--ptx", "-std=c++17", "--fmad=false", "-O3", "-lineinfo"])
            .arg(format!("-arch=compute_{cap}"))
            .arg("-Icuda")
            .arg(&src)
            .arg("-o")
            .arg(&ptx)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {} ({e}): install the CUDA toolkit or set CUDA_ROOT",
                    nvcc.display()
                )
            });
        if !status.success() {
            panic!("nvcc failed on {}", src.display());
        }
    }
}

/// The files `cuda/*.EXT`, in name order.
fn files_ending(ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir("cuda")
        .expect("crates/kernels/cuda is part of the crate")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    files
}

fn nvcc() -> PathBuf {
    for var in ["CUDA_ROOT", "CUDA_PATH"] {
        if let Some(root) = env::var_os(var) {
            let p = Path::new(&root).join("bin").join("nvcc");
            if p.exists() {
                return p;
            }
        }
    }
    PathBuf::from("nvcc")
}

fn compute_cap() -> String {
    if let Ok(cap) = env::var("CUDA_COMPUTE_CAP") {
        return cap.replace('.', "");
    }
    let smi = Command::new("nvidia-smi")
        .args(["--query-gpu=compute_cap", "--format=csv,noheader"])
        .output();
    match smi {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .replace('.', ""),
        _ => panic!(
            "the cuda feature needs the GPU's compute capability: set CUDA_COMPUTE_CAP (e.g. 90 for an H100)"
        ),
    }
}
