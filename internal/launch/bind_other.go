//go:build !linux

package launch

import "errors"

func allowedCPUs() ([]int, error) {
	return nil, errors.New("binding ranks to CPUs needs Linux")
}

func startOn(cpu int, start func() error) error {
	if cpu >= 0 {
		return errors.New("binding ranks to CPUs needs Linux")
	}
	return start()
}
