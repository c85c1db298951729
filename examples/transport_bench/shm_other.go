//go:build !linux

package main

import (
	"context"
	"errors"
	"io"

	"github.com/gdist/gdist/dist/transport"
)

// The shared-memory transport is Linux-only.
const shmSupported = false

type shmTransport = transport.Transport

type shmResults struct{}

var errNoShm = errors.New("the shared-memory transport needs Linux")

func (b *bench) setupShm(context.Context, string) error       { return errNoShm }
func (b *bench) measureShm(context.Context, *results) error   { return errNoShm }
func (b *bench) allReduceShm(context.Context, *results) error { return errNoShm }
func (r *results) printShm(io.Writer)                         {}
