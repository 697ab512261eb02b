#!/usr/bin/env bash
# Prints one line naming this machine's CPU as benchmarks need it: the model name (which a
# virtual machine often reduces to "AMD EPYC"), vendor family/model/stepping (which tell CPU
# generations apart), cache sizes, the copy-related instruction sets, the transparent huge page
# settings (segments use them, callers' pools do not), and the idle driver with its halt polling
# (on a virtual machine, how long an idle CPU takes to wake moves every small call). Sourced by
# scripts/bench.sh and scripts/bench-upstream.sh; run alone, it prints the line.

machine_cpu() {
    local name family model stepping l2 l3 flags thp shmem idle poll
    name=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n1 || true)
    family=$(grep -m1 '^cpu family' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | tr -d ' ' || true)
    model=$(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | tr -d ' ' || true)
    stepping=$(grep -m1 '^stepping' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | tr -d ' ' || true)
    l2=$(lscpu 2>/dev/null | sed -n 's/^L2 cache: *//p' | head -n1 || true)
    l3=$(lscpu 2>/dev/null | sed -n 's/^L3 cache: *//p' | head -n1 || true)
    flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | tr ' ' '\n' |
        { grep -xE 'avx2|avx512f|erms|fsrm' || true; } | tr '\n' ' ' | sed 's/ $//' || true)
    thp=$(sed -n 's/.*\[\(.*\)\].*/\1/p' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || true)
    shmem=$(sed -n 's/.*\[\(.*\)\].*/\1/p' /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>/dev/null || true)
    idle=$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || true)
    poll=$(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns 2>/dev/null || true)
    echo "${name:-unknown CPU}, family ${family:-?} model ${model:-?} stepping ${stepping:-?}," \
        "L2 ${l2:-?}, L3 ${l3:-?}, flags: ${flags:-none of avx2 avx512f erms fsrm}," \
        "THP ${thp:-?} (shmem ${shmem:-?}), cpuidle ${idle:-none}${poll:+ (guest_halt_poll_ns $poll)}"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    machine_cpu
fi
