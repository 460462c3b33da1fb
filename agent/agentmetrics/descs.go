package agentmetrics

import "github.com/prometheus/client_golang/prometheus"

// GPU families. Labels: gpu (NVML index) and uuid; no job or token data.
var (
	gpuLabels  = []string{"gpu", "uuid"}
	nvmlUpDesc = prometheus.NewDesc(Namespace+"_nvml_up", "Whether NVML answered this scrape: 1 yes; 0 with the reason (no driver, no cgo).",
		[]string{"reason"}, nil)
	gpuCountDesc = prometheus.NewDesc(Namespace+"_gpus", "GPUs NVML sees.", nil, nil)
	utilDesc     = prometheus.NewDesc(Namespace+"_gpu_utilization_ratio", "Fraction of the last sample period a kernel ran on the GPU (0-1).", gpuLabels, nil)
	memUtilDesc  = prometheus.NewDesc(Namespace+"_gpu_memory_utilization_ratio", "Fraction of the last sample period device memory was read or written (0-1).", gpuLabels, nil)
	memUsedDesc  = prometheus.NewDesc(Namespace+"_gpu_memory_used_bytes", "Device memory in use.", gpuLabels, nil)
	memTotalDesc = prometheus.NewDesc(Namespace+"_gpu_memory_total_bytes", "Device memory installed.", gpuLabels, nil)
	tempDesc     = prometheus.NewDesc(Namespace+"_gpu_temperature_celsius", "GPU die temperature.", gpuLabels, nil)
	powerDesc    = prometheus.NewDesc(Namespace+"_gpu_power_watts", "Power the board draws.", gpuLabels, nil)
	clockDesc    = prometheus.NewDesc(Namespace+"_gpu_clock_hertz", "Current clock by domain (graphics, sm, memory).",
		append(gpuLabels[:2:2], "clock"), nil)
	eccDesc = prometheus.NewDesc(Namespace+"_gpu_ecc_errors_total", "ECC memory errors since the driver loaded, by type (corrected, uncorrected).",
		append(gpuLabels[:2:2], "type"), nil)
	throttleDesc = prometheus.NewDesc(Namespace+"_gpu_throttle_reason", "Whether a reason is holding the GPU's clocks down now: 1 yes, 0 no.",
		append(gpuLabels[:2:2], "reason"), nil)
	xidDesc = prometheus.NewDesc(Namespace+"_gpu_xid_errors_total", "XID critical error events NVML reported since the agent started, by XID code.",
		append(gpuLabels[:2:2], "xid"), nil)

	gpuDescs = []*prometheus.Desc{nvmlUpDesc, gpuCountDesc, utilDesc, memUtilDesc, memUsedDesc, memTotalDesc, tempDesc, powerDesc,
		clockDesc, eccDesc, throttleDesc, xidDesc}
)
