//go:build cgo

package agentmetrics_test

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpupass/gpupass/agent/agentmetrics"
	"github.com/gpupass/gpupass/internal/testutil/promtest"
)

// telemetry fills go-nvml's DGX H100 mock with what a busy board answers;
// GPU 2 is thermally throttled with ECC errors and raised XID 79 twice,
// GPU 7 answers nothing beyond the mock's defaults (an older driver).
func telemetry(s *server.Server) {
	for i, d := range s.Devices {
		if i == 7 {
			continue
		}
		dev := d.(*server.Device)
		dev.MemoryInfo.Used = 60 << 30
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: 97, Memory: 40}, nvml.SUCCESS
		}
		dev.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return uint32(60 + i), nvml.SUCCESS }
		dev.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 650_500, nvml.SUCCESS }
		dev.GetClockInfoFunc = func(t nvml.ClockType) (uint32, nvml.Return) {
			if t == nvml.CLOCK_MEM {
				return 2619, nvml.SUCCESS
			}
			return 1980, nvml.SUCCESS
		}
		dev.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, _ nvml.EccCounterType) (uint64, nvml.Return) {
			if i == 2 && t == nvml.MEMORY_ERROR_TYPE_CORRECTED {
				return 12, nvml.SUCCESS
			}
			return 0, nvml.SUCCESS
		}
		dev.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
			if i == 2 {
				return nvml.ClocksThrottleReasonHwThermalSlowdown | nvml.ClocksEventReasonSwPowerCap, nvml.SUCCESS
			}
			return 0, nvml.SUCCESS
		}
		dev.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
		dev.GetIndexFunc = func() (int, nvml.Return) { return i, nvml.SUCCESS }
	}
	xid2 := s.Devices[2]
	pending := []nvml.EventData{
		{Device: xid2, EventType: nvml.EventTypeXidCriticalError, EventData: 79},
		{Device: xid2, EventType: nvml.EventTypeXidCriticalError, EventData: 79},
	}
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
			if len(pending) == 0 {
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
			ev := pending[0]
			pending = pending[1:]
			return ev, nvml.SUCCESS
		}}, nvml.SUCCESS
	}
}

// TestNVMLTelemetry: every GPU family from go-nvml's DGX H100 mock, the
// XID events counted, a device that supports little left partly out,
// and promtool's conventions kept.
func TestNVMLTelemetry(t *testing.T) {
	t.Parallel()
	s := dgxh100.New()
	telemetry(s)
	m := agentmetrics.New(agentmetrics.NewNVML(s))
	body := expose(t, m)
	promtest.CheckMetrics(t, body)
	fams := promtest.Parse(t, body)
	uuid2 := s.Devices[2].(*server.Device).UUID
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"gpupass_agent_nvml_up", nil, 1},
		{"gpupass_agent_gpus", nil, 8},
		{"gpupass_agent_gpu_utilization_ratio", []string{"gpu=0"}, 0.97},
		{"gpupass_agent_gpu_memory_total_bytes", []string{"gpu=0"}, 80 << 30},
		{"gpupass_agent_gpu_memory_used_bytes", []string{"gpu=1"}, 60 << 30},
		{"gpupass_agent_gpu_temperature_celsius", []string{"gpu=2", "uuid=" + uuid2}, 62},
		{"gpupass_agent_gpu_power_watts", []string{"gpu=3"}, 650.5},
		{"gpupass_agent_gpu_clock_hertz", []string{"gpu=0", "clock=sm"}, 1980e6},
		{"gpupass_agent_gpu_clock_hertz", []string{"gpu=0", "clock=memory"}, 2619e6},
		{"gpupass_agent_gpu_ecc_errors_total", []string{"gpu=2", "type=corrected"}, 12},
		{"gpupass_agent_gpu_throttle_reason", []string{"gpu=2", "reason=hw_thermal_slowdown"}, 1},
		{"gpupass_agent_gpu_throttle_reason", []string{"gpu=2", "reason=sw_power_cap"}, 1},
		{"gpupass_agent_gpu_throttle_reason", []string{"gpu=2", "reason=gpu_idle"}, 0},
		{"gpupass_agent_gpu_throttle_reason", []string{"gpu=1"}, 0},
		{"gpupass_agent_gpu_xid_errors_total", []string{"gpu=2", "uuid=" + uuid2, "xid=79"}, 2},
		// GPU 7 answers memory (the mock's default), not utilization.
		{"gpupass_agent_gpu_memory_total_bytes", []string{"gpu=7"}, 80 << 30},
	} {
		got, ok := promtest.Value(fams, c.name, c.labels...)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (found %t), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if _, ok := promtest.Value(fams, "gpupass_agent_gpu_utilization_ratio", "gpu=7"); ok {
		t.Error("utilization of GPU 7 exported though its driver does not answer it")
	}
	// XID events are handed over once; the counter keeps them.
	fams = promtest.Parse(t, expose(t, m))
	if got, _ := promtest.Value(fams, "gpupass_agent_gpu_xid_errors_total", "xid=79"); got != 2 {
		t.Errorf("xid 79 after a second scrape = %v, want still 2", got)
	}
}

// TestNVMLNotAvailable: no driver, or a binding that panics, is
// gpupass_agent_nvml_up 0 with the reason, not a failed scrape or a crash.
func TestNVMLNotAvailable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		lib    nvml.Interface
		reason string
	}{
		{"no driver", &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }},
			"NVML not available: libnvidia-ml.so.1 not found (no NVIDIA driver on this machine)"},
		{"partial binding", &mock.Interface{}, "NVML not available: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			body := expose(t, agentmetrics.New(agentmetrics.NewNVML(c.lib)))
			promtest.CheckMetrics(t, body)
			fams := promtest.Parse(t, body)
			up := fams["gpupass_agent_nvml_up"]
			if up == nil || len(up.Metric) != 1 || up.Metric[0].Gauge.GetValue() != 0 {
				t.Fatalf("gpupass_agent_nvml_up = %v, want one sample of 0", up)
			}
			if r := up.Metric[0].Label[0].GetValue(); len(r) < len(c.reason) || r[:len(c.reason)] != c.reason {
				t.Errorf("reason %q, want it to start with %q", r, c.reason)
			}
			if _, ok := fams["gpupass_agent_gpus"]; ok {
				t.Error("gpupass_agent_gpus exported without NVML")
			}
		})
	}
}
