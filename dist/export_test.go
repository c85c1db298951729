package dist

// Exported for the external test package (process_hybrid_test.go), whose
// ranks join through gdist.InitFromEnv and then run the checks of this
// package's own multi-process tests.
var (
	ChildCollectives = childCollectives
	ChildKill        = childKill
	KillMidStream    = killMidStream
)

const (
	LightEnv    = lightEnv
	RaceEnabled = raceEnabled
)
