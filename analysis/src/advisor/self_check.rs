//! The model's check on itself: the machine the profile was measured on, at the measured
//! node count, must predict the iteration time that was measured. Each part is scaled by a
//! ratio that is 1 there, and the loader and the link are calibrated on it, so a miss means
//! the model read the measurement as something it was not (a two-node job taken as one node
//! predicts its measured network away). The prediction then says so, and names the part.

use super::measured::Measured;
use super::model::InstancePrediction;

/// Share of the measured iteration a prediction of the measured shape may miss it by before
/// it is said (the link's rate found by bisection, hidden communication's lower bound).
const TOLERANCE: f64 = 0.05;
/// s a miss is never said below (communication hidden behind backward: under 1 ms).
const NOISE_SECONDS: f64 = 1e-3;

/// Adds to the measured shape's prediction (`p.current`) why it misses the measured time,
/// when it does.
pub(super) fn check(m: &Measured, p: &mut InstancePrediction) {
    let (true, Some(t), Some(bd)) = (p.current, p.predicted_iteration_seconds, p.breakdown) else {
        return;
    };
    let measured = m.iteration_seconds;
    let miss = t - measured;
    if miss.abs() <= NOISE_SECONDS.max(TOLERANCE * measured) {
        return;
    }
    let Some(((name, was), (_, now))) = m
        .breakdown
        .named()
        .into_iter()
        .zip(bd.named())
        .max_by(|a, b| (a.0 .1 - a.1 .1).abs().total_cmp(&(b.0 .1 - b.1 .1).abs()))
    else {
        return;
    };
    let why = if name == "network" && now == 0.0 && m.nodes <= 1 {
        " (one node needs no network: was the profile one node of a larger job? world_size and local_world_size, or --measured-nodes, say how many nodes it had)"
    } else {
        ""
    };
    p.extrapolations.push(format!(
        "the model gives {t:.3} s for the measured shape, which measured {measured:.3} s ({:+.0}%): its {name} part is {now:.3} s against {was:.3} s measured{why}",
        miss / measured * 100.0
    ));
}
