"""The benchmark protocol, the suite over every runtime, the device bundle, the report and the roofline."""
