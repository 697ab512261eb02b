//! `get_into_ranges`: byte ranges of many objects gathered into many registered buffers.
//!
//! Each (buffer, key) group is one read spread over parts: the requested ranges go straight
//! into the caller's memory and the bytes between them into scratch, so a group costs one
//! transfer of the whole object. Groups whose source ranges overlap read the object into scratch
//! and copy the ranges out. The object sizes come from one batch replica-list call first.

// Unsafe here: slices of registered memory, made only from ranges that `registry` checked to lie
// inside one registration, while the call holds that registration's lease.
#![allow(unsafe_code)]

use super::zero_copy::{check, RangeRequest};
use crate::engine::Engine;
use crate::errors::{code, invalid};
use crate::registry::{self, Range};
use moonkv_proto::msg::KeysRequest;
use moonkv_proto::Error;
use pyo3::prelude::*;
use std::collections::HashMap;

/// One requested range: where it goes, where it comes from in the object.
#[derive(Clone, Copy)]
struct Wanted {
    dst: Range,
    src: usize,
    /// Index into the flat list of all destinations of the call.
    flat: usize,
    /// Index of the range in its group, as the caller listed it.
    r: usize,
}

/// The ranges of one (buffer, key) pair.
struct Group {
    buffer: usize,
    slot: usize,
    key: String,
    ranges: Vec<Wanted>,
}

pub(super) fn get_into_ranges(
    py: Python<'_>,
    engine: &Engine,
    request: RangeRequest,
) -> PyResult<Vec<Vec<Vec<i64>>>> {
    let RangeRequest {
        buffer_ptrs,
        keys,
        dst,
        src,
        sizes,
    } = request;
    let mut results: Vec<Vec<Vec<i64>>> = dst
        .iter()
        .map(|per_key| per_key.iter().map(|r| vec![0; r.len()]).collect())
        .collect();
    let n = buffer_ptrs.len();
    if keys.len() != n || dst.len() != n || src.len() != n || sizes.len() != n {
        let e = invalid("buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets and all_sizes must have the same length");
        fill_all(&mut results, &e);
        return Ok(results);
    }

    // Shape checks and destination ranges.
    let mut groups: Vec<Group> = Vec::new();
    let mut flat: Vec<Range> = Vec::new();
    for b in 0..n {
        if keys[b].len() != dst[b].len()
            || src[b].len() != dst[b].len()
            || sizes[b].len() != dst[b].len()
        {
            fill_buffer(
                &mut results[b],
                &invalid("the lists of one buffer must have one entry per key"),
            );
            continue;
        }
        for (k, key) in keys[b].iter().enumerate() {
            let (d, s, z) = (&dst[b][k], &src[b][k], &sizes[b][k]);
            if s.len() != d.len() || z.len() != d.len() {
                fill(
                    &mut results[b][k],
                    &invalid("one offset and size per range"),
                );
                continue;
            }
            let key = match key {
                Ok(k) => k.clone(),
                Err(e) => {
                    fill(&mut results[b][k], e);
                    continue;
                }
            };
            let mut ranges = Vec::with_capacity(d.len());
            for r in 0..d.len() {
                let Some(ptr) = buffer_ptrs[b].checked_add(d[r]) else {
                    results[b][k][r] = code(&invalid("destination wraps the address space")) as i64;
                    continue;
                };
                ranges.push(Wanted {
                    dst: Range { ptr, len: z[r] },
                    src: s[r],
                    flat: flat.len(),
                    r,
                });
                flat.push(Range { ptr, len: z[r] });
            }
            groups.push(Group {
                buffer: b,
                slot: k,
                key,
                ranges,
            });
        }
    }
    let (lease, dst_errors) = check(engine, &flat, true);

    // Object sizes, one call for every distinct key.
    let mut distinct: Vec<String> = groups.iter().map(|g| g.key.clone()).collect();
    distinct.sort();
    distinct.dedup();
    let request = KeysRequest {
        tenant: engine.store.tenant().to_string(),
        keys: distinct.clone(),
    };
    let answer = engine.wait(py, engine.store.master().batch_get_replica_list(request));
    let object_sizes: HashMap<String, Result<usize, Error>> = match answer {
        Ok(items) if items.len() == distinct.len() => distinct
            .into_iter()
            .zip(items)
            .map(|(key, item)| {
                let size = item.0.and_then(|list| {
                    list.replicas
                        .first()
                        .map(|r| r.size as usize)
                        .ok_or_else(|| {
                            Error::new(
                                moonkv_proto::ErrorCode::REPLICA_IS_NOT_READY,
                                "no readable replica",
                            )
                        })
                });
                (key, size)
            })
            .collect(),
        Ok(_) => {
            return Ok(failed_all(
                results,
                &invalid("the master answered for a different number of keys"),
            ))
        }
        Err(e) => return Ok(failed_all(results, &e)),
    };

    // Which ranges of each group are read, and how.
    struct Plan {
        group: usize,
        size: usize,
        ranges: Vec<Wanted>,
        /// Source ranges overlap: read everything into scratch, copy afterwards.
        via_scratch: bool,
    }
    let mut plans: Vec<Plan> = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        let out = &mut results[group.buffer][group.slot];
        let size = match &object_sizes[&group.key] {
            Ok(s) => *s,
            Err(e) => {
                for w in &group.ranges {
                    out[w.r] = code(e) as i64;
                }
                continue;
            }
        };
        let mut good = Vec::new();
        for w in &group.ranges {
            let slot = w.r;
            if let Some(e) = &dst_errors[w.flat] {
                out[slot] = code(e) as i64;
            } else if w.src.checked_add(w.dst.len).is_none_or(|end| end > size) {
                out[slot] = code(&invalid(format!(
                    "range {}+{} is past the end of '{}' ({size} bytes)",
                    w.src, w.dst.len, group.key
                ))) as i64;
            } else {
                good.push(*w);
            }
        }
        if good.is_empty() {
            continue;
        }
        good.sort_by_key(|w| w.src);
        let via_scratch = good.windows(2).any(|p| p[0].src + p[0].dst.len > p[1].src);
        plans.push(Plan {
            group: g,
            size,
            ranges: good,
            via_scratch,
        });
    }

    // Scratch for the bytes nobody asked for (or the whole object).
    let mut scratch: Vec<Vec<u8>> = plans
        .iter()
        .map(|p| {
            let asked: usize = p.ranges.iter().map(|w| w.dst.len).sum();
            vec![
                0u8;
                if p.via_scratch {
                    p.size
                } else {
                    p.size - asked
                }
            ]
        })
        .collect();
    let outcomes = {
        let mut bufs: Vec<Vec<&mut [u8]>> = Vec::with_capacity(plans.len());
        for (plan, spare) in plans.iter().zip(scratch.iter_mut()) {
            if plan.via_scratch {
                bufs.push(vec![spare.as_mut_slice()]);
                continue;
            }
            let mut parts: Vec<&mut [u8]> = Vec::new();
            let mut rest: &mut [u8] = spare.as_mut_slice();
            let mut at = 0;
            for w in &plan.ranges {
                let (gap, tail) = std::mem::take(&mut rest).split_at_mut(w.src - at);
                rest = tail;
                if !gap.is_empty() {
                    parts.push(gap);
                }
                // SAFETY: `check` found the range inside a leased registration, and no other
                // destination of this call overlaps it.
                parts.push(unsafe { registry::slice_mut(w.dst, &lease) });
                at = w.src + w.dst.len;
            }
            if !rest.is_empty() {
                parts.push(rest);
            }
            bufs.push(parts);
        }
        let keys: Vec<&str> = plans.iter().map(|p| groups[p.group].key.as_str()).collect();
        engine.wait(py, engine.store.batch_get_into_parts(&keys, &mut bufs))
    };

    for ((plan, outcome), spare) in plans.iter().zip(outcomes).zip(&scratch) {
        let group = &groups[plan.group];
        let out = &mut results[group.buffer][group.slot];
        for w in &plan.ranges {
            let slot = w.r;
            out[slot] = match &outcome {
                Err(e) => code(e) as i64,
                Ok(read) if w.src + w.dst.len > *read => code(&invalid(format!(
                    "'{}' shrank to {read} bytes during the call",
                    group.key
                ))) as i64,
                Ok(_) => {
                    if plan.via_scratch {
                        // SAFETY: as above; the parts borrowing the memory are gone.
                        let dst = unsafe { registry::slice_mut(w.dst, &lease) };
                        dst.copy_from_slice(&spare[w.src..w.src + w.dst.len]);
                    }
                    w.dst.len as i64
                }
            };
        }
    }
    scratch.clear();
    Ok(results)
}

fn fill(out: &mut [i64], e: &Error) {
    out.iter_mut().for_each(|v| *v = code(e) as i64);
}

fn fill_buffer(out: &mut [Vec<i64>], e: &Error) {
    out.iter_mut().for_each(|r| fill(r, e));
}

fn fill_all(out: &mut [Vec<Vec<i64>>], e: &Error) {
    out.iter_mut().for_each(|b| fill_buffer(b, e));
}

fn failed_all(mut out: Vec<Vec<Vec<i64>>>, e: &Error) -> Vec<Vec<Vec<i64>>> {
    fill_all(&mut out, e);
    out
}
