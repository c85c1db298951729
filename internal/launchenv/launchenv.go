// Package launchenv reads the layout of a job — this process's rank, the
// world size, the local rank and where rank 0 serves the rendezvous — from
// the environment of the launcher that started it: gdistrun or torchrun,
// Slurm's srun, Open MPI's mpirun, MPICH or Intel MPI (Hydra's PMI
// variables), or a Kubernetes Indexed Job. It is the ground floor under
// gdist.InitFromEnv and imports no other package of the project.
//
// # Usage
//
//	job, err := launchenv.FromEnv(os.LookupEnv)
//	if err != nil { ... }           // a *launchenv.Error naming the variable
//	job.Rank, job.WorldSize, job.MasterAddr, job.MasterPort
//
// What each launcher gives:
//
//   - gdistrun, torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
//     MASTER_PORT. Under torchrun (TORCHELASTIC_RUN_ID is set) MASTER_PORT
//     is torchrun's own rendezvous store, which its agent on the first node
//     keeps open for the life of the job, so the job's rendezvous uses the
//     port after it (MasterPort = MASTER_PORT+1) unless GDIST_MASTER_PORT
//     names one.
//   - Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID. Without
//     MASTER_ADDR, rank 0 is the first task of the step, which Slurm's
//     block distribution places on the first host of SLURM_STEP_NODELIST
//     (else SLURM_JOB_NODELIST, else SLURM_NODELIST), in hostlist syntax
//     such as node[01-04,07]; a single-host step meets on loopback. Without
//     MASTER_PORT the port is derived from SLURM_JOB_ID and SLURM_STEP_ID.
//   - Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE. When
//     every rank is on this host the job meets on loopback, on a port
//     derived from the job id (OMPI_MCA_ess_base_jobid, else PMIX_NAMESPACE);
//     across hosts MASTER_ADDR must be passed (mpirun -x MASTER_ADDR=host0).
//   - MPICH, Intel MPI: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
//     (Hydra); like Open MPI, with the port derived from PMI_KVSNAME or
//     PMI_JOBID.
//   - Kubernetes Indexed Job: JOB_COMPLETION_INDEX is the rank; WORLD_SIZE,
//     MASTER_ADDR (the index-0 pod's DNS name under the job's headless
//     Service) and MASTER_PORT come from the manifest (deploy/kubernetes).
//
// MASTER_ADDR and MASTER_PORT, when set, always win.
package launchenv

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
)

// Environment variables read in every launcher's case.
const (
	EnvMasterAddr      = "MASTER_ADDR"
	EnvMasterPort      = "MASTER_PORT"
	EnvGDistMasterPort = "GDIST_MASTER_PORT" // overrides the derived port (and torchrun's +1)
)

// Launcher names, as Job.Launcher reports them.
const (
	Torchrun   = "torchrun" // also gdistrun, which sets the same variables
	Slurm      = "slurm"
	OpenMPI    = "openmpi"
	PMI        = "pmi" // MPICH, Intel MPI
	Kubernetes = "kubernetes"
)

// Derived ports lie in [PortBase, PortBase+PortSpan): below Linux's default
// ephemeral range (32768-60999), so that no outgoing connection of another
// program holds one by chance.
const (
	PortBase = 20000
	PortSpan = 10000
)

// ErrHostlist is wrapped by the errors of ExpandHostlist and FirstHost.
var ErrHostlist = errors.New("launchenv: bad hostlist")

// Error reports a missing or malformed launcher variable.
type Error struct {
	Var    string // the variable
	Value  string // its value ("" if unset)
	Reason string
}

func (e *Error) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("%s: %s", e.Var, e.Reason)
	}
	return fmt.Sprintf("%s=%q: %s", e.Var, e.Value, e.Reason)
}

// Job is the layout the environment describes.
type Job struct {
	Launcher  string // "" when no launcher variable is set (a world of one)
	Rank      int
	WorldSize int
	LocalRank int
	// LocalWorldSize is the number of ranks on this host, or 0 if the
	// launcher does not say.
	LocalWorldSize int
	// MasterAddr is the host rank 0 listens on for the rendezvous; "" when
	// nothing tells it (a world of one, or a multi-host MPI job without
	// MASTER_ADDR: Missing names the variable then).
	MasterAddr string
	// MasterPort is the rendezvous port, or 0 when nothing tells it.
	MasterPort int
	// Multihost reports whether the ranks may span hosts (so a rank must
	// listen on an address its peers can reach, not on loopback).
	Multihost bool
	// Derived lists how MasterAddr and MasterPort were found, when they were
	// not given directly (e.g. "MASTER_ADDR from SLURM_STEP_NODELIST").
	Derived []string
}

type layout struct {
	launcher           string
	rank, world, local string // variable names; local may be ""
	localSize          string // may be ""
	jobIDs             []string
}

// layouts are the launchers, in order of precedence: the first whose rank
// variable is set describes the job.
var layouts = []layout{
	{launcher: Torchrun, rank: "RANK", world: "WORLD_SIZE", local: "LOCAL_RANK", localSize: "LOCAL_WORLD_SIZE"},
	{launcher: Kubernetes, rank: "JOB_COMPLETION_INDEX", world: "WORLD_SIZE"},
	{launcher: Slurm, rank: "SLURM_PROCID", world: "SLURM_NTASKS", local: "SLURM_LOCALID",
		jobIDs: []string{"SLURM_JOB_ID", "SLURM_JOBID"}},
	{launcher: OpenMPI, rank: "OMPI_COMM_WORLD_RANK", world: "OMPI_COMM_WORLD_SIZE",
		local: "OMPI_COMM_WORLD_LOCAL_RANK", localSize: "OMPI_COMM_WORLD_LOCAL_SIZE",
		jobIDs: []string{"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid"}},
	{launcher: PMI, rank: "PMI_RANK", world: "PMI_SIZE", local: "MPI_LOCALRANKID", localSize: "MPI_LOCALNRANKS",
		jobIDs: []string{"PMI_KVSNAME", "PMI_JOBID"}},
}

// RankVars returns every variable FromEnv may read, for tests that clear
// the environment.
func RankVars() []string {
	vars := []string{EnvMasterAddr, EnvMasterPort, EnvGDistMasterPort, "TORCHELASTIC_RUN_ID",
		"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_STEP_ID", "SLURM_STEPID",
		"SLURM_NNODES", "SLURM_JOB_NUM_NODES"}
	for _, l := range layouts {
		for _, v := range []string{l.rank, l.world, l.local, l.localSize} {
			if v != "" {
				vars = append(vars, v)
			}
		}
		vars = append(vars, l.jobIDs...)
	}
	return vars
}

// FromEnv reads the job layout through lookup (os.LookupEnv, or a map in
// tests). An empty value counts as unset. With no launcher variable the job
// is a world of one. Errors are *Error values naming the variable.
func FromEnv(lookup func(string) (string, bool)) (Job, error) {
	get := func(name string) (string, bool) {
		if name == "" {
			return "", false
		}
		v, ok := lookup(name)
		return v, ok && v != ""
	}
	for _, l := range layouts {
		rs, ok := get(l.rank)
		if !ok {
			continue
		}
		return fromLayout(l, rs, get)
	}
	job := Job{WorldSize: 1}
	if err := masterFromVars(&job, get); err != nil {
		return Job{}, err
	}
	return job, nil
}

func fromLayout(l layout, rs string, get func(string) (string, bool)) (Job, error) {
	job := Job{Launcher: l.launcher}
	var err error
	if job.Rank, err = intVar(l.rank, rs); err != nil {
		return Job{}, err
	}
	ws, ok := get(l.world)
	if !ok {
		return Job{}, &Error{Var: l.world, Reason: fmt.Sprintf("not set, but %s is", l.rank)}
	}
	if job.WorldSize, err = intVar(l.world, ws); err != nil {
		return Job{}, err
	}
	if job.WorldSize < 1 {
		return Job{}, &Error{Var: l.world, Value: ws, Reason: "must be at least 1"}
	}
	if job.Rank < 0 || job.Rank >= job.WorldSize {
		return Job{}, &Error{Var: l.rank, Value: rs, Reason: fmt.Sprintf("not in [0, %s=%d)", l.world, job.WorldSize)}
	}
	job.LocalRank = job.Rank
	if v, ok := get(l.local); ok {
		if job.LocalRank, err = intVar(l.local, v); err != nil {
			return Job{}, err
		}
		if job.LocalRank < 0 || job.LocalRank >= job.WorldSize {
			return Job{}, &Error{Var: l.local, Value: v, Reason: fmt.Sprintf("not in [0, %d)", job.WorldSize)}
		}
	} else if l.launcher == Kubernetes {
		job.LocalRank = 0 // one rank per pod
	}
	if v, ok := get(l.localSize); ok {
		if job.LocalWorldSize, err = intVar(l.localSize, v); err != nil {
			return Job{}, err
		}
	}
	if l.launcher == Kubernetes {
		job.LocalWorldSize = 1
	}
	if err := masterFromVars(&job, get); err != nil {
		return Job{}, err
	}
	switch l.launcher {
	case Torchrun:
		if _, ok := get("TORCHELASTIC_RUN_ID"); ok && job.MasterPort != 0 {
			if _, set := get(EnvGDistMasterPort); !set {
				job.MasterPort++
				job.Derived = append(job.Derived, "MASTER_PORT+1 (torchrun's store holds MASTER_PORT)")
			}
		}
		// Without LOCAL_WORLD_SIZE nothing says the ranks span hosts.
		job.Multihost = job.LocalWorldSize != 0 && job.LocalWorldSize < job.WorldSize
	case Kubernetes:
		job.Multihost = job.WorldSize > 1
	case Slurm:
		err = slurmMaster(&job, get)
	case OpenMPI, PMI:
		mpiMaster(&job, l)
		err = derivePort(&job, l.jobIDs, get)
	}
	if err != nil {
		return Job{}, err
	}
	return job, nil
}

// masterFromVars applies MASTER_ADDR, MASTER_PORT and GDIST_MASTER_PORT.
func masterFromVars(job *Job, get func(string) (string, bool)) error {
	if v, ok := get(EnvMasterAddr); ok {
		job.MasterAddr = v
	}
	for _, name := range []string{EnvMasterPort, EnvGDistMasterPort} {
		v, ok := get(name)
		if !ok {
			continue
		}
		p, err := strconv.Atoi(v)
		if err != nil || p < 1 || p > 65535 {
			return &Error{Var: name, Value: v, Reason: "not a port number"}
		}
		job.MasterPort = p
	}
	return nil
}

func slurmMaster(job *Job, get func(string) (string, bool)) error {
	nodes := 0
	for _, name := range []string{"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"} {
		if v, ok := get(name); ok {
			if n, err := strconv.Atoi(v); err == nil {
				nodes = n
				break
			}
		}
	}
	var first, from string
	for _, name := range []string{"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"} {
		v, ok := get(name)
		if !ok {
			continue
		}
		hosts, err := ExpandHostlist(v)
		if err != nil {
			return &Error{Var: name, Value: v, Reason: err.Error()}
		}
		first, from = hosts[0], name
		if nodes == 0 || len(hosts) < nodes {
			nodes = len(hosts)
		}
		break
	}
	job.Multihost = nodes != 1
	if job.MasterAddr == "" {
		switch {
		case nodes == 1:
			job.MasterAddr = "127.0.0.1"
			job.Derived = append(job.Derived, "MASTER_ADDR 127.0.0.1 (a one-node step)")
		case first != "":
			job.MasterAddr = first
			job.Derived = append(job.Derived, "MASTER_ADDR "+first+" (first host of "+from+")")
		}
	}
	ids := []string{"SLURM_JOB_ID", "SLURM_JOBID"}
	if job.MasterPort == 0 {
		step := ""
		for _, name := range []string{"SLURM_STEP_ID", "SLURM_STEPID"} {
			if v, ok := get(name); ok {
				step = v
				break
			}
		}
		for _, name := range ids {
			if v, ok := get(name); ok {
				job.MasterPort = portFor(v + "." + step)
				job.Derived = append(job.Derived, fmt.Sprintf("MASTER_PORT %d (from %s=%s, step %q)", job.MasterPort, name, v, step))
				break
			}
		}
	}
	return nil
}

// mpiMaster sets a loopback master for an MPI job whose ranks are all on
// this host.
func mpiMaster(job *Job, l layout) {
	local := job.LocalWorldSize == job.WorldSize
	job.Multihost = !local
	if job.MasterAddr == "" && local {
		job.MasterAddr = "127.0.0.1"
		job.Derived = append(job.Derived, fmt.Sprintf("MASTER_ADDR 127.0.0.1 (%s=%d: every rank on this host)", l.localSize, job.LocalWorldSize))
	}
}

func derivePort(job *Job, ids []string, get func(string) (string, bool)) error {
	if job.MasterPort != 0 {
		return nil
	}
	for _, name := range ids {
		if v, ok := get(name); ok {
			job.MasterPort = portFor(v)
			job.Derived = append(job.Derived, fmt.Sprintf("MASTER_PORT %d (from %s=%s)", job.MasterPort, name, v))
			return nil
		}
	}
	return nil
}

// portFor maps a job identifier to a port in [PortBase, PortBase+PortSpan).
// Every rank of the job computes the same port; two jobs on one host collide
// with probability 1/PortSpan, and MASTER_PORT overrides it.
func portFor(id string) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return PortBase + int(h.Sum32()%PortSpan)
}

func intVar(name, v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, &Error{Var: name, Value: v, Reason: "not an integer"}
	}
	return n, nil
}
