//go:build cgo

package agentmetrics

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupass/gpupass/internal/probe/nvmlprobe"
)

// NVML reads GPU telemetry at scrape time through an nvml.Interface:
// nvml.New() on a node, a pkg/nvml/mock server in tests. NVML is
// initialised at the first scrape and kept (tried again at each scrape
// while it fails); a read a device does not support is left out.
type NVML struct {
	lib nvml.Interface

	mu     sync.Mutex
	inited bool
	events nvml.EventSet // nil when XID events cannot be registered
	// xids counts XID events by device UUID and XID code: a counter the
	// collector keeps, since NVML hands each event over once.
	xids map[xidKey]float64
}

type xidKey struct{ gpu, uuid, xid string }

// NewNVML returns a collector over lib.
func NewNVML(lib nvml.Interface) *NVML { return &NVML{lib: lib, xids: map[xidKey]float64{}} }

// DefaultNVML returns a collector over the system's libnvidia-ml.
func DefaultNVML() prometheus.Collector { return NewNVML(nvml.New()) }

// maxEventsPerScrape bounds the XID events drained in one scrape (the
// rest wait for the next); a GPU in an XID storm must not stall scrapes.
const maxEventsPerScrape = 256

// throttleReasons are the clock event reasons exported, by label value.
var throttleReasons = []struct {
	name string
	bit  uint64
}{
	{"gpu_idle", nvml.ClocksEventReasonGpuIdle},
	{"applications_clocks_setting", nvml.ClocksEventReasonApplicationsClocksSetting},
	{"sw_power_cap", nvml.ClocksEventReasonSwPowerCap},
	{"hw_slowdown", nvml.ClocksThrottleReasonHwSlowdown},
	{"sync_boost", nvml.ClocksEventReasonSyncBoost},
	{"sw_thermal_slowdown", nvml.ClocksEventReasonSwThermalSlowdown},
	{"hw_thermal_slowdown", nvml.ClocksThrottleReasonHwThermalSlowdown},
	{"hw_power_brake_slowdown", nvml.ClocksThrottleReasonHwPowerBrakeSlowdown},
}

func (c *NVML) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range gpuDescs {
		ch <- d
	}
}

func (c *NVML) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if reason := c.init(); reason != "" {
		ch <- prometheus.MustNewConstMetric(nvmlUpDesc, prometheus.GaugeValue, 0, reason)
		return
	}
	ch <- prometheus.MustNewConstMetric(nvmlUpDesc, prometheus.GaugeValue, 1, "")
	n, ret := safe2(func() (int, nvml.Return) { return c.lib.DeviceGetCount() })
	if ret != nvml.SUCCESS {
		return
	}
	ch <- prometheus.MustNewConstMetric(gpuCountDesc, prometheus.GaugeValue, float64(n))
	for i := range n {
		dev, ret := safe2(func() (nvml.Device, nvml.Return) { return c.lib.DeviceGetHandleByIndex(i) })
		if ret != nvml.SUCCESS {
			continue
		}
		c.device(ch, strconv.Itoa(i), dev)
	}
	c.drainXIDs()
	for k, v := range c.xids {
		ch <- prometheus.MustNewConstMetric(xidDesc, prometheus.CounterValue, v, k.gpu, k.uuid, k.xid)
	}
}

// init initialises NVML once; it returns why it is not available ("" when
// it is).
func (c *NVML) init() (reason string) {
	if c.inited {
		return ""
	}
	defer func() {
		// A binding that lacks a symbol (old driver, partial mock) must
		// not take the agent down.
		if r := recover(); r != nil {
			reason = fmt.Sprintf("NVML not available: %v", r)
		}
	}()
	if ret := c.lib.Init(); ret != nvml.SUCCESS {
		return "NVML not available: " + nvmlprobe.Describe(ret)
	}
	c.inited = true
	c.events = c.registerXIDs()
	return ""
}

func (c *NVML) registerXIDs() nvml.EventSet {
	set, ret := safe2(func() (nvml.EventSet, nvml.Return) { return c.lib.EventSetCreate() })
	if ret != nvml.SUCCESS || set == nil {
		return nil
	}
	n, ret := safe2(func() (int, nvml.Return) { return c.lib.DeviceGetCount() })
	if ret != nvml.SUCCESS {
		return nil
	}
	any := false
	for i := range n {
		dev, ret := safe2(func() (nvml.Device, nvml.Return) { return c.lib.DeviceGetHandleByIndex(i) })
		if ret != nvml.SUCCESS {
			continue
		}
		if safe1(func() nvml.Return { return dev.RegisterEvents(nvml.EventTypeXidCriticalError, set) }) == nvml.SUCCESS {
			any = true
		}
	}
	if !any {
		return nil
	}
	return set
}

// drainXIDs takes the XID events NVML holds, without waiting.
func (c *NVML) drainXIDs() {
	if c.events == nil {
		return
	}
	for range maxEventsPerScrape {
		ev, ret := safe2(func() (nvml.EventData, nvml.Return) { return c.events.Wait(0) })
		if ret != nvml.SUCCESS {
			return // ERROR_TIMEOUT: none left
		}
		if ev.EventType != nvml.EventTypeXidCriticalError {
			continue
		}
		k := xidKey{gpu: "unknown", xid: strconv.FormatUint(ev.EventData, 10)}
		if ev.Device != nil {
			if u, ret := safe2(ev.Device.GetUUID); ret == nvml.SUCCESS {
				k.uuid = u
			}
			if idx, ret := safe2(ev.Device.GetIndex); ret == nvml.SUCCESS {
				k.gpu = strconv.Itoa(idx)
			}
		}
		c.xids[k]++
	}
}

func (c *NVML) device(ch chan<- prometheus.Metric, idx string, dev nvml.Device) {
	uuid, _ := safe2(dev.GetUUID)
	gauge := func(d *prometheus.Desc, v float64, extra ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{idx, uuid}, extra...)...)
	}
	if u, ret := safe2(dev.GetUtilizationRates); ret == nvml.SUCCESS {
		gauge(utilDesc, float64(u.Gpu)/100)
		gauge(memUtilDesc, float64(u.Memory)/100)
	}
	if mem, ret := safe2(dev.GetMemoryInfo); ret == nvml.SUCCESS {
		gauge(memUsedDesc, float64(mem.Used))
		gauge(memTotalDesc, float64(mem.Total))
	}
	if t, ret := safe2(func() (uint32, nvml.Return) { return dev.GetTemperature(nvml.TEMPERATURE_GPU) }); ret == nvml.SUCCESS {
		gauge(tempDesc, float64(t))
	}
	if p, ret := safe2(dev.GetPowerUsage); ret == nvml.SUCCESS {
		gauge(powerDesc, float64(p)/1000)
	}
	for _, ck := range []struct {
		name string
		t    nvml.ClockType
	}{{"graphics", nvml.CLOCK_GRAPHICS}, {"sm", nvml.CLOCK_SM}, {"memory", nvml.CLOCK_MEM}} {
		if mhz, ret := safe2(func() (uint32, nvml.Return) { return dev.GetClockInfo(ck.t) }); ret == nvml.SUCCESS {
			gauge(clockDesc, float64(mhz)*1e6, ck.name)
		}
	}
	for _, e := range []struct {
		name string
		t    nvml.MemoryErrorType
	}{{"corrected", nvml.MEMORY_ERROR_TYPE_CORRECTED}, {"uncorrected", nvml.MEMORY_ERROR_TYPE_UNCORRECTED}} {
		if n, ret := safe2(func() (uint64, nvml.Return) { return dev.GetTotalEccErrors(e.t, nvml.VOLATILE_ECC) }); ret == nvml.SUCCESS {
			ch <- prometheus.MustNewConstMetric(eccDesc, prometheus.CounterValue, float64(n), idx, uuid, e.name)
		}
	}
	if bits, ret := safe2(dev.GetCurrentClocksEventReasons); ret == nvml.SUCCESS {
		for _, r := range throttleReasons {
			v := 0.0
			if bits&r.bit != 0 {
				v = 1
			}
			gauge(throttleDesc, v, r.name)
		}
	}
}

// safe2 calls an NVML read, turning a panic (a symbol the driver or a
// partial mock lacks) into ERROR_NOT_SUPPORTED.
func safe2[T any](f func() (T, nvml.Return)) (v T, ret nvml.Return) {
	defer func() {
		if recover() != nil {
			ret = nvml.ERROR_NOT_SUPPORTED
		}
	}()
	return f()
}

func safe1(f func() nvml.Return) (ret nvml.Return) {
	defer func() {
		if recover() != nil {
			ret = nvml.ERROR_NOT_SUPPORTED
		}
	}()
	return f()
}
