int cxlkv_probe(void);
