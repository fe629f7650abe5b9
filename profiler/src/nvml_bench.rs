//! `stallscope nvml-bench`: what each NVML call the GPU source makes costs on this machine,
//! so the fast tier's rate can be chosen knowing its price.

use stallscope_agent::gpu::nvml::NvmlBackend;

use crate::cli::NvmlBenchArgs;

/// Times every call; without an NVIDIA driver says so and returns exit code 1.
pub fn nvml_bench(args: NvmlBenchArgs) -> anyhow::Result<i32> {
    let mut backend = match NvmlBackend::open() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("stallscope nvml-bench: {e}; nothing to measure on this machine");
            return Ok(1);
        }
    };
    let rows = backend.bench(args.rounds.max(1));
    println!("{:>3}  {:<44} {:>12}", "gpu", "NVML call", "µs per call");
    for row in rows {
        match row.per_call {
            Ok(d) => println!(
                "{:>3}  {:<44} {:>12.1}",
                row.gpu,
                row.call,
                d.as_secs_f64() * 1e6
            ),
            Err(why) => println!("{:>3}  {:<44} {:>12}  ({why})", row.gpu, row.call, "-"),
        }
    }
    Ok(0)
}
