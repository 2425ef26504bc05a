#!/bin/bash
echo "Helo, wrld"
