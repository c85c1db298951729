// Package certs makes throwaway X.509 certificates for TLS between the ranks
// of a job: a certificate authority and leaf certificates it signs, each valid
// for client and server authentication (every rank both dials and accepts).
// The tests, benchmarks and examples use it to run gdist over TLS without
// any set-up; a real deployment brings certificates from its own PKI.
//
// # Usage
//
//	ca, err := certs.NewCA("gdist job CA")
//	leaf, err := ca.Issue("rank 0", "127.0.0.1", "localhost") // IP addresses and DNS names
//	cfg := leaf.Config()                                      // for tcp.WithTLS
//	files, err := leaf.Write(dir)                             // PEM files for GDIST_TLS_CERT, _KEY, _CA
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Validity is how long the certificates are valid, from an hour before
// they are made (to allow for clock skew).
const Validity = 7 * 24 * time.Hour

// CA is a certificate authority that signs leaf certificates.
type CA struct {
	cert *x509.Certificate
	der  []byte
	key  *ecdsa.PrivateKey
}

// NewCA makes a self-signed CA (ECDSA P-256) with the given common name.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl, err := template(name)
	if err != nil {
		return nil, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("certs: make CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, der: der, key: key}, nil
}

// Pool returns a pool holding the CA's certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// PEM returns the CA's certificate in PEM.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der})
}

// Leaf is a certificate the CA signed and its private key.
type Leaf struct {
	ca   *CA
	cert tls.Certificate
	der  []byte
	key  []byte // PKCS #8 DER
}

// Issue makes a leaf certificate with the given common name for hosts:
// each an IP address or a DNS name, as the dialing side checks them.
func (ca *CA) Issue(name string, hosts ...string) (*Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl, err := template(name)
	if err != nil {
		return nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("certs: issue %q: %w", name, err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &Leaf{ca: ca, der: der, key: kder, cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}}, nil
}

// Config returns a TLS configuration with the leaf as this side's
// certificate and the CA as the only one trusted (tcp.WithTLS takes it).
func (l *Leaf) Config() *tls.Config {
	pool := l.ca.Pool()
	return &tls.Config{
		Certificates: []tls.Certificate{l.cert},
		RootCAs:      pool,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS13,
	}
}

// Files are the PEM files Write makes.
type Files struct {
	Cert, Key, CA string
}

// Write writes the leaf's certificate (cert.pem), its private key
// (key.pem, mode 0600) and the CA's certificate (ca.pem) into dir, which
// it creates if need be.
func (l *Leaf) Write(dir string) (Files, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Files{}, err
	}
	f := Files{
		Cert: filepath.Join(dir, "cert.pem"),
		Key:  filepath.Join(dir, "key.pem"),
		CA:   filepath.Join(dir, "ca.pem"),
	}
	for _, w := range []struct {
		path string
		typ  string
		der  []byte
		mode os.FileMode
	}{
		{f.Cert, "CERTIFICATE", l.der, 0o644},
		{f.Key, "PRIVATE KEY", l.key, 0o600},
		{f.CA, "CERTIFICATE", l.ca.der, 0o644},
	} {
		b := pem.EncodeToMemory(&pem.Block{Type: w.typ, Bytes: w.der})
		if err := os.WriteFile(w.path, b, w.mode); err != nil {
			return Files{}, err
		}
	}
	return f, nil
}

func template(name string) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(Validity),
	}, nil
}
