// Epoch clocks of the benchmark scripts and pages (Node and browsers): `clock.tick()` at each epoch's end records the
// wall milliseconds since the last tick (or since the clock started, `restart()`) and, in Node, the process's CPU
// milliseconds (all threads).

export function epochClock() {
  const cpuUsage = typeof process !== 'undefined' && process.cpuUsage ? () => process.cpuUsage() : null;
  const clock = {wallMs: [], cpuMs: [], last: performance.now(), lastCpu: cpuUsage && cpuUsage()};
  clock.restart = () => {
    clock.last = performance.now();
    if (cpuUsage) clock.lastCpu = cpuUsage();
    return clock.last;
  };
  clock.tick = () => {
    const now = performance.now();
    clock.wallMs.push(now - clock.last);
    if (cpuUsage) {
      const used = process.cpuUsage(clock.lastCpu);
      clock.cpuMs.push((used.user + used.system) / 1e3);
    }
    clock.restart();
  };
  return clock;
}
