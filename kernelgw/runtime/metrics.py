"""Prometheus metrics of one gateway.

Each app gets its own registry (several gateways can live in one test process);
``/metrics`` renders it. Only the session manager and sessions update it.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kernelgw import events as ev

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions_active = Gauge("kernelgw_sessions_active", "Sessions with a kernel", registry=r)
        self.pool_ready = Gauge("kernelgw_pool_ready", "Warm kernels ready to hand over", registry=r)
        self.pool_hits = Counter("kernelgw_pool_hits", "Sessions served from the warm pool", registry=r)
        self.pool_misses = Counter("kernelgw_pool_misses", "Sessions that had to start cold", registry=r)
        self.session_start = Histogram(
            "kernelgw_session_start_seconds",
            "Time to create a session",
            ["source"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.executions = Counter("kernelgw_executions", "Executions by final status", ["status"], registry=r)
        self.execution_seconds = Histogram(
            "kernelgw_execution_seconds", "Execution duration (queue excluded)", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.output_bytes = Counter("kernelgw_output_bytes", "Output bytes produced by kernels", registry=r)
        self.oom_kills = Counter("kernelgw_oom_kills", "Kernels killed for exceeding their memory", registry=r)
        self.timeouts = Counter("kernelgw_timeouts", "Executions that hit their timeout", registry=r)
        self.restarts = Counter("kernelgw_kernel_restarts", "Kernel restarts", ["reason"], registry=r)
        self.paused_snapshot_bytes = Gauge(
            "kernelgw_paused_snapshot_bytes",
            "Bytes of the gateway's disk held by paused sessions' snapshots (within paused_budget_mb)",
            registry=r,
        )
        self.output_paced = Counter(
            "kernelgw_output_paced_seconds",
            "Seconds output readers waited to pace a flood while other sessions had output",
            registry=r,
        )

    def execution_done(self, done: ev.Done, output_bytes: int, oom_killed: bool = False) -> None:
        self.executions.labels(done.status).inc()
        self.execution_seconds.observe(done.duration_ms / 1000)
        self.output_bytes.inc(output_bytes)
        if done.status == "timeout":
            self.timeouts.inc()
        if oom_killed:
            self.oom_kills.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
