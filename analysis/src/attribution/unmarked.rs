//! Rule 4: where no marker speaks, each sample tick decides. The loop thread's busy share is
//! compute (the GPU's beyond it too); the idle rest is network or interconnect when a link
//! carried more than [`QUIET_LINK_BYTES_PER_S`], else data when the loader used more than
//! [`IDLE_LOADER_CORES`], else `other`.

use crate::category::Category;
use crate::series::SeriesId;
use crate::timeline::SeriesStore;
use crate::Nanos;

use super::counters::{
    busy_parts, gpu_busy, gpu_link_bytes, link_bytes, loader_activity, per, transfer_weights,
    LoaderActivity,
};
use super::inputs::{Links, RankSeries, IDLE_LOADER_CORES, QUIET_LINK_BYTES_PER_S};
use super::parts::Parts;
use super::Basis;

/// Weights per (category, basis) summed over the ticks, ns.
#[derive(Default)]
struct Weights(Vec<(Category, Basis, f64)>);

impl Weights {
    fn add(&mut self, c: Category, basis: Basis, w: f64) {
        if w > 0.0 {
            match self.0.iter_mut().find(|x| x.0 == c && x.1 == basis) {
                Some(x) => x.2 += w,
                None => self.0.push((c, basis, w)),
            }
        }
    }
}

/// Attributes `[a, b]` of a rank tick by tick.
pub(super) fn attribute_unmarked(
    parts: &mut Parts,
    store: &SeriesStore,
    rank: &RankSeries,
    links: &Links,
    (a, b): (Nanos, Nanos),
) {
    let Some(cpu_id) = rank.main.cpu else {
        parts.put(Category::Other, Basis::Unexplained, b - a);
        return;
    };
    let mut cuts = vec![a];
    cuts.extend(store.times_within(cpu_id, a + 1, b.saturating_sub(1)));
    cuts.push(b);
    let mut weights = Weights::default();
    for w in cuts.windows(2) {
        tick(&mut weights, store, rank, links, cpu_id, (w[0], w[1]));
    }
    parts.apportion(b - a, &weights.0, (Category::Other, Basis::Unexplained));
}

/// One tick `[x, y]`: the busy share, then the idle rest.
fn tick(
    weights: &mut Weights,
    store: &SeriesStore,
    rank: &RankSeries,
    links: &Links,
    cpu_id: SeriesId,
    (x, y): (Nanos, Nanos),
) {
    let len = (y - x) as f64;
    if len <= 0.0 {
        return;
    }
    if store.counter_delta(cpu_id, x, y).is_none() {
        weights.add(Category::Other, Basis::Unexplained, len);
        return;
    }
    let (ran, queued) = busy_parts(store, &rank.main, x, y);
    let cpu_busy = ((ran + queued) / len).clamp(0.0, 1.0);
    let queued_share = if ran + queued > 0.0 {
        queued / (ran + queued)
    } else {
        0.0
    };
    weights.add(
        Category::Compute,
        Basis::CounterBusy,
        cpu_busy * (1.0 - queued_share) * len,
    );
    weights.add(
        Category::Compute,
        Basis::CounterRunQueue,
        cpu_busy * queued_share * len,
    );
    let gpu_busy = rank
        .gpu
        .as_ref()
        .and_then(|g| gpu_busy(store, g, x, y))
        .unwrap_or(0.0);
    // The GPU's busy time beyond the CPU thread's: kernels ran while the loop slept.
    let busy = cpu_busy.max(gpu_busy);
    weights.add(Category::Compute, Basis::GpuBusy, (busy - cpu_busy) * len);
    let idle = (1.0 - busy) * len;
    if idle > 0.0 {
        idle_tick(weights, store, rank, links, (x, y), idle);
    }
}

/// The `idle` ns of tick `[x, y]`: a link that carried traffic, else a busy loader, else
/// `other`.
fn idle_tick(
    weights: &mut Weights,
    store: &SeriesStore,
    rank: &RankSeries,
    links: &Links,
    (x, y): (Nanos, Nanos),
    idle: f64,
) {
    let len = (y - x) as f64;
    let secs = len / 1e9;
    let nic_bytes = link_bytes(store, &links.nic, x, y);
    let nic_rate = nic_bytes / secs;
    let local_rate = link_bytes(store, &links.local, x, y) / secs;
    let (gpu_link_rate, gpu_weight) = match rank.gpu.as_ref() {
        Some(g) => {
            let (nvlink, pcie) = gpu_link_bytes(store, g, nic_bytes, x, y);
            (
                (nvlink + pcie) / secs,
                per(nvlink, links.nvlink_bytes_per_s) + per(pcie, links.pcie_bytes_per_s),
            )
        }
        None => (0.0, 0.0),
    };
    let loud = |rate: f64, weight: f64| {
        if rate > QUIET_LINK_BYTES_PER_S {
            weight
        } else {
            0.0
        }
    };
    if nic_rate > QUIET_LINK_BYTES_PER_S
        || local_rate > QUIET_LINK_BYTES_PER_S
        || gpu_link_rate > QUIET_LINK_BYTES_PER_S
    {
        let (n, l) = transfer_weights(store, links, x, y);
        let n = loud(nic_rate, n);
        let l = loud(local_rate, l);
        let g = loud(gpu_link_rate, gpu_weight);
        let all = n + l + g;
        if all > 0.0 {
            weights.add(Category::Network, Basis::CounterNic, idle * n / all);
            weights.add(Category::Interconnect, Basis::CounterLocal, idle * l / all);
            weights.add(
                Category::Interconnect,
                Basis::CounterGpuLink,
                idle * g / all,
            );
        } else {
            weights.add(Category::Other, Basis::Unexplained, idle);
        }
        return;
    }
    let loader = if rank.loaders.is_empty() {
        LoaderActivity::default() // the loop itself is the loader, and it was idle
    } else {
        loader_activity(store, rank, None, x, y)
    };
    if loader.busy() + loader.io > IDLE_LOADER_CORES * len {
        let total = loader.busy() + loader.io;
        let prep = idle * loader.busy() / total;
        let queued = prep * loader.queued_share();
        weights.add(Category::DataPrep, Basis::CounterLoader, prep - queued);
        weights.add(Category::DataPrep, Basis::LoaderRunQueue, queued);
        weights.add(
            Category::DataFetch,
            Basis::CounterLoader,
            idle * loader.io / total,
        );
    } else if link_bytes(store, &links.data_rx, x, y) > 0.0 {
        // The loader asleep while its sockets received: fetching over the network.
        weights.add(Category::DataFetch, Basis::DataLoaderNet, idle);
    } else {
        weights.add(Category::Other, Basis::Unexplained, idle);
    }
}
