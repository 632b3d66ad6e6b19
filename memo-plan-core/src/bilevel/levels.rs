//! The two levels themselves, shared by every caller: the planner places a schedule's buffers
//! with it ([`super::place`]), and the C ABI's record/replay allocator places a recorded
//! iteration with it (block markers instead of a schedule's blocks).
//!
//! The input is a list of level-2 requests in the caller's order, each either a *group* of buffers
//! laid back to back at consecutive aligned offsets (one buffer is a group of one), or a level-1
//! *block* whose buffers are placed among themselves first. Blocks with the same key and the same
//! requests relative to the block's first step (lifetimes and sizes, in member order) are solved
//! once and share offsets: this is how every layer reuses one layer's plan. A block then takes
//! part in level 2 as one request of its level-1 peak over its members' span. A buffer's offset
//! is its request's level-2 offset plus its offset inside the group or block.
//!
//! Inside a block's span its region belongs to it alone, and its members never overlap each
//! other (level 1), so the result is a valid placement; callers still run an independent checker.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use super::PlacementError;
use crate::lifetime::{footprint, BufferLifetime};
use crate::plan::PlacementSummary;
use memo_place::SolveOptions;

/// One request of level 2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Level2Request<K> {
    /// Buffers (indices into the buffer list) at consecutive aligned offsets, in this order.
    Group(Vec<usize>),
    /// A level-1 block: its buffers are placed among themselves, once per distinct
    /// (`key`, relative requests).
    Block {
        /// What makes two blocks eligible to share a layout besides equal requests (the planner
        /// uses `()`: equal requests suffice; the allocator uses the framework's block key).
        key: K,
        /// The block's buffers, indices into the buffer list.
        members: Vec<usize>,
    },
}

/// The two levels' answer.
#[derive(Clone, Debug, PartialEq)]
pub struct TwoLevelPlacement {
    /// One offset per buffer of the input; `None` for a buffer no request names.
    pub offsets: Vec<Option<u64>>,
    /// The distinct level-1 problems solved, in the order first met.
    pub level1: Vec<PlacementSummary>,
    /// For each request, the level-1 problem it used (`None` for groups).
    pub problem_of: Vec<Option<usize>>,
    /// Level 2.
    pub level2: PlacementSummary,
}

/// Places `requests` over `buffers` in two levels: each distinct block with `level1_options`,
/// then every request with `level2_options` (whose capacity, if any, bounds the whole arena).
/// Fails when the solver fails, when a size sum passes 64 bits, or when a block or group is
/// empty (it would have no span).
pub fn place_two_level<K: Ord + Clone>(
    buffers: &[BufferLifetime],
    requests: &[Level2Request<K>],
    level1_options: &SolveOptions,
    level2_options: &SolveOptions,
) -> Result<TwoLevelPlacement, PlacementError> {
    let span_of = |members: &[usize]| -> Result<(u32, u32), PlacementError> {
        let mut span = (u32::MAX, 0);
        for &m in members {
            let buffer = buffers.get(m).ok_or(PlacementError::Unused { buffer: m })?;
            span = (span.0.min(buffer.lower), span.1.max(buffer.upper));
        }
        if span.0 >= span.1 {
            // An empty request, or members that are never live: nothing to place it over.
            return Err(PlacementError::Unused { buffer: members.first().copied().unwrap_or(0) });
        }
        Ok(span)
    };

    // Level 1: one solve per distinct (key, relative requests).
    type Signature = Vec<(u32, u32, u64)>;
    let mut problems: BTreeMap<(K, Signature), usize> = BTreeMap::new();
    let mut solved: Vec<(Vec<u64>, PlacementSummary)> = Vec::new();
    let mut problem_of = Vec::with_capacity(requests.len());
    let mut level2 = Vec::with_capacity(requests.len());
    for (index, request) in requests.iter().enumerate() {
        let (lower, upper) = match request {
            Level2Request::Group(members) | Level2Request::Block { members, .. } => span_of(members)?,
        };
        let size = match request {
            Level2Request::Group(members) => {
                problem_of.push(None);
                let mut size = 0u64;
                for &m in members {
                    let aligned =
                        footprint(buffers[m].size, level2_options.alignment).ok_or(PlacementError::Overflow)?;
                    size = size.checked_add(aligned).ok_or(PlacementError::Overflow)?;
                }
                size
            }
            Level2Request::Block { key, members } => {
                let signature: Signature = members
                    .iter()
                    .map(|&m| (buffers[m].lower - lower, buffers[m].upper - lower, buffers[m].size))
                    .collect();
                let problem = match problems.get(&(key.clone(), signature.clone())) {
                    Some(&problem) => problem,
                    None => {
                        solved.push(solve(signature.iter().copied(), level1_options)?);
                        problems.insert((key.clone(), signature), solved.len() - 1);
                        solved.len() - 1
                    }
                };
                problem_of.push(Some(problem));
                solved[problem].1.peak_bytes
            }
        };
        level2.push(BufferLifetime { id: index as u64, lower, upper, size });
    }
    let (bases, level2_summary) = solve(level2.iter().map(|b| (b.lower, b.upper, b.size)), level2_options)?;

    let mut offsets = alloc::vec![None; buffers.len()];
    for ((request, problem), &base) in requests.iter().zip(&problem_of).zip(&bases) {
        match (request, problem) {
            (Level2Request::Group(members), _) => {
                let mut offset = base;
                for &m in members {
                    offsets[m] = Some(offset);
                    let aligned =
                        footprint(buffers[m].size, level2_options.alignment).ok_or(PlacementError::Overflow)?;
                    offset = offset.checked_add(aligned).ok_or(PlacementError::Overflow)?;
                }
            }
            // Every block was given its problem above.
            (Level2Request::Block { members, .. }, problem) => {
                if let Some(problem) = problem {
                    for (&m, &inner) in members.iter().zip(&solved[*problem].0) {
                        offsets[m] = Some(base.checked_add(inner).ok_or(PlacementError::Overflow)?);
                    }
                }
            }
        }
    }
    Ok(TwoLevelPlacement {
        offsets,
        level1: solved.into_iter().map(|(_, summary)| summary).collect(),
        problem_of,
        level2: level2_summary,
    })
}

/// Places `(lower, upper, bytes)` requests with the arena solver: their offsets and the summary a
/// plan reports.
fn solve(
    requests: impl Iterator<Item = (u32, u32, u64)>,
    options: &SolveOptions,
) -> Result<(Vec<u64>, PlacementSummary), PlacementError> {
    let lifetimes: Vec<BufferLifetime> = requests
        .enumerate()
        .map(|(i, (lower, upper, size))| BufferLifetime { id: i as u64, lower, upper, size })
        .collect();
    let solution = memo_place::solve(&lifetimes, options)?;
    let summary = PlacementSummary {
        buffers: lifetimes.len() as u32,
        peak_bytes: solution.peak,
        lower_bound_bytes: solution.lower_bound,
        optimal: solution.optimal,
        nodes: solution.stats.nodes,
    };
    Ok((solution.offsets, summary))
}
