package api

// Run-related request limits (see runs.proto).
const (
	// MaxSubmitBytes bounds a Submit (the work dir archive travels in it).
	MaxSubmitBytes = 64 << 20
	// MaxRecordsBytes bounds one UploadRecords batch.
	MaxRecordsBytes = 16 << 20
)
