//! `stallscope doctor`: what this machine lets stallscope see, source by source — each GPU
//! with its readings present or missing and why, and the CPU, disk, NIC, PSI and perf
//! sources — so a missing figure in a profile can be explained before a run.

use std::fmt::Write;

use stallscope_agent::gpu::backend::{GpuBackend, GpuError, Metric};
use stallscope_agent::gpu::nvml::NvmlBackend;
use stallscope_agent::gpu::probe_all;
use stallscope_agent::sampler::default_sources;
use stallscope_agent::sources::packets;
use stallscope_agent::sources::perf::probe_software_event;
use stallscope_agent::sources::rdma::class_dir;
use stallscope_agent::sources::{Registry, Roots, Watched};

use crate::cli::DoctorArgs;

/// Runs the checks and prints the report; exit code 0 (a missing source is information).
pub fn doctor(args: DoctorArgs) -> anyhow::Result<i32> {
    let roots = args.roots.roots();
    let mut nvml = NvmlBackend::open();
    let gpu = match &mut nvml {
        Ok(b) => Ok(b as &mut dyn GpuBackend),
        Err(e) => Err(&*e),
    };
    print!("{}", report(gpu, &roots));
    Ok(0)
}

/// The report for a GPU backend (or why there is none) and the sources under `roots`.
pub fn report(gpu: Result<&mut dyn GpuBackend, &GpuError>, roots: &Roots) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "GPU (NVML)");
    match gpu {
        Err(e) => {
            let _ = writeln!(out, "  missing  {e}: GPU, PCIe and NVLink series are off");
        }
        Ok(backend) => gpu_report(&mut out, backend),
    }
    let _ = writeln!(out, "Node sources");
    node_sources_report(&mut out, roots);
    out
}

/// The driver, then each GPU and every reading present or missing and why.
fn gpu_report(out: &mut String, backend: &mut dyn GpuBackend) {
    let d = backend.driver();
    let cuda = d.cuda_version.as_deref().unwrap_or("unknown");
    let _ = writeln!(
        out,
        "  driver {} · NVML {} · CUDA {cuda}",
        d.driver_version, d.nvml_version
    );
    let probed = probe_all(backend);
    if probed.is_empty() {
        let _ = writeln!(out, "  missing  the driver lists no GPU");
    }
    for (info, caps) in probed {
        let links = info
            .nvlinks
            .map_or("unknown".to_string(), |n| n.to_string());
        let _ = writeln!(
            out,
            "  GPU {} {} · {} · bus {} · NVLinks {links}",
            info.index, info.name, info.uuid, info.pci_bus_id
        );
        for m in Metric::ALL {
            let entry = caps.entries.iter().find(|(x, _)| *x == m);
            let _ = match (entry.map(|e| &e.1), caps.note(m)) {
                (Some(Ok(())), Some(how)) => writeln!(out, "    present  {}: {how}", m.name()),
                (Some(Ok(())), None) => writeln!(out, "    present  {}", m.name()),
                (Some(Err(why)), _) => writeln!(out, "    missing  {}: {why}", m.name()),
                (None, _) => writeln!(out, "    missing  {}: not probed", m.name()),
            };
        }
    }
}

/// Each node source sampled once on this process, and the software perf event.
fn node_sources_report(out: &mut String, roots: &Roots) {
    let watched = Watched::new(vec![std::process::id()]);
    let mut registry = Registry::default();
    for mut source in default_sources(roots) {
        if source.name() == "packets" {
            // Said below, opened once.
            continue;
        }
        let label = match source.name() {
            "process" => "cpu (process schedstat, state)",
            "thread_states" => "cpu (thread states from the scheduler's events, eBPF)",
            "process_launchers" => "cpu (launchers, at the slow tier)",
            "process_totals" => "cpu (process totals, io)",
            "net" => "nic (interface byte counters)",
            "disk" => "disk (diskstats)",
            "psi" => "psi (pressure stall information)",
            "rdma" => "rdma (port byte counters)",
            "rdma_counters" => "rdma (port wait, congestion, retransmission counters)",
            other => other,
        };
        let _ = match source.sample(&watched, &mut registry) {
            Ok(()) => writeln!(out, "  present  {label}: {}", source.describe()),
            Err(e) => writeln!(out, "  missing  {label}: {e}"),
        };
        registry.take_values();
    }
    let rdma = class_dir(roots);
    if !rdma.is_dir() {
        let _ = writeln!(
            out,
            "  missing  rdma: no RDMA devices ({} missing)",
            rdma.display()
        );
    }
    let _ = match packets::probe(roots, "any") {
        Ok(what) => writeln!(out, "  present  packets: {what}"),
        Err(why) => writeln!(out, "  missing  packets (optional): {why}"),
    };
    let _ = match probe_software_event(&roots.proc) {
        Ok(what) => writeln!(out, "  present  perf: {what}"),
        Err(why) => writeln!(out, "  missing  perf (optional): {why}"),
    };
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    use stallscope_agent::gpu::fake::ScriptedGpu;

    use super::*;

    #[test]
    fn without_a_driver_the_gpu_is_missing_and_the_node_sources_are_listed() {
        let text = report(
            Err(&GpuError::NoDriver("libnvidia-ml.so.1: not found".into())),
            &Roots::default(),
        );
        assert!(text.contains("missing  no NVIDIA driver found"), "{text}");
        for source in ["cpu (process", "nic (", "disk (", "psi (", "perf", "rdma"] {
            assert!(text.contains(source), "{source} in {text}");
        }
        // From eBPF where it could be loaded (root, BTF), else polled, saying why not.
        let polled =
            text.contains("present  cpu (process schedstat") && text.contains("eBPF not used");
        assert!(
            polled || text.contains("present  cpu (thread states"),
            "{text}"
        );
    }

    /// Issue 29: each RDMA port with the counters read of it, on the recorded mlx5 and EFA
    /// tree; "no RDMA devices" where there is none (the first test, on this machine).
    #[test]
    fn rdma_ports_are_listed_with_their_counters() {
        let sys = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/testdata/rdma");
        let roots = Roots {
            sys,
            ..Roots::default()
        };
        let text = report(Err(&GpuError::NoDriver("none".into())), &roots);
        assert!(!text.contains("no RDMA devices"), "{text}");
        assert!(
            text.contains("present  rdma (port byte counters): efa_0/1: rx_bytes, tx_bytes; mlx5_0/1: port_rcv_data (× 4 bytes)"),
            "{text}"
        );
        assert!(
            text.contains("mlx5_0/1: port_xmit_wait, port_xmit_discards, np_cnp_sent, rp_cnp_handled, out_of_sequence, packet_seq_err"),
            "{text}"
        );
        let empty = tempfile::tempdir().unwrap();
        let roots = Roots {
            sys: empty.path().to_path_buf(),
            ..Roots::default()
        };
        let text = report(Err(&GpuError::NoDriver("none".into())), &roots);
        assert!(text.contains("missing  rdma: no RDMA devices ("), "{text}");
    }

    #[test]
    fn each_gpu_lists_every_capability_with_the_reason_for_a_missing_one() {
        let mut gpu = ScriptedGpu::h100_node(2, Arc::new(AtomicU64::new(0)));
        gpu.unsupported(1, Metric::Gpm, "GPM needs a Hopper or newer GPU");
        let text = report(Ok(&mut gpu), &Roots::default());
        assert!(text.contains("driver 550.90.07"), "{text}");
        assert!(text.contains("GPU 1 NVIDIA H100 80GB HBM3"), "{text}");
        assert!(text.contains("NVLinks 18"), "{text}");
        assert_eq!(text.matches("present  pcie_rx_bytes").count(), 2, "{text}");
        assert!(
            text.contains("missing  gpm (sm, tensor, dram, pcie, nvlink): GPM needs a Hopper"),
            "{text}"
        );
    }
}
