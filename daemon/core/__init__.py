"""The transactions of cgd (decide under the lock, write durably, then act) and the upkeep that keeps the state true."""
